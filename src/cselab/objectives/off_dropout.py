"""ImSimCSE's off-dropout negatives (Xu et al. 2023, Sec. 3.2, Eq. 3).

The batch is encoded a third time with *every* dropout switched off (the ``off`` view). The
positive stays the two dropout views; the negatives become similarities between off-dropout
representations of different sentences, weighted by the trade-off ``m``::

    l_i = -log( e^{s(z¹_i,z²_i)} / ( e^{s(z¹_i,z²_i)} + m Σ_{j≠i} e^{s(z_i,z_j)} ) )

with ``s = cos/τ`` and ``z_i`` the off-dropout representation. Gradients flow through the
off-dropout pass, as in the authors' code.

The authors' released code computes a different objective: no weight on the negatives, and the
positive logit multiplied by a ratio (``pos_ratio``, default 0.9) both in the numerator and in
the log-sum-exp, i.e. ``-r·s_p + log(e^{r·s_p} + Σ_{j≠i} e^{s(z_i,z_j)})``.
:class:`PositiveRatioScore` offers that as the ``authors_code`` variant.
"""

from __future__ import annotations

from torch import Tensor

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import Score
from .infonce import InBatchNegatives
from .papers import Paper
from .sections.off_dropout import OffDropoutConfig
from .spaces import OFF_DROPOUT_SPACE

#: The paper of this module's parts, of :mod:`.dcl`, of :mod:`.noise` (its ablation) and of
#: :mod:`.barlow` (its baseline). Its own method is off-dropout negatives plus DCL (Eq. 6).
IMSIMCSE = Paper(
    key="xu2023imsimcse",
    name="ImSimCSE",
    summary="negatives scored on representations without dropout, and a dimension-wise "
    "contrastive term (DCL)",
    bibtex="""@article{xu2023imsimcse,
  title   = {{ImSimCSE}: Improving Contrastive Learning for Sentence Embeddings from Two Perspectives},
  author  = {Xu, Jiahao and Shao, Wei and Chen, Lihui and Liu, Lemao},
  journal = {arXiv preprint},
  year    = {2023}
}""",
    tag="imsimcse",
    method=("off-dropout", "dcl"),
)


class OffDropoutNegatives(InBatchNegatives):
    """In-batch negatives between off-dropout representations, weighted by ``m`` (Eq. 3).

    Args:
        tradeoff: ``m`` > 0 (paper: 0.9); ``1`` gives an unweighted denominator.
    """

    papers = (IMSIMCSE,)
    tags = ("off-dropout",)

    def __init__(self, tradeoff: float = OffDropoutConfig.tradeoff) -> None:
        super().__init__(OFF_DROPOUT_SPACE, weight=tradeoff)

    def describe(self, kind: DataKind = SENTENCES) -> str:
        weight = (
            f"negatives weighted by m = {self.weight:g} (Eq. 3)"
            if self.weight != 1.0
            else "negatives unweighted"
        )
        return (
            "**Off-dropout negatives** (ImSimCSE, Xu et al. 2023, Eq. 3): negatives are scored "
            f"between representations computed with dropout switched off; {weight}."
        )


class PositiveRatioScore(Score):
    """Wraps a score and multiplies the positive energy by ``ratio`` (ImSimCSE authors' code).

    Because the temperature divides energies afterwards, the positive logit becomes
    ``ratio · e_p / τ`` in both the numerator and the log-sum-exp; negatives are unchanged.
    """

    papers = (IMSIMCSE,)

    def __init__(
        self, inner: Score | None = None, ratio: float = OffDropoutConfig.tradeoff
    ) -> None:
        super().__init__()
        self.inner = inner if inner is not None else Score()
        self.ratio = float(ratio)

    def positive(self, sim: Tensor) -> Tensor:
        return self.ratio * self.inner.positive(sim)

    def negative(self, sim: Tensor) -> Tensor:
        return self.inner.negative(sim)

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            "**ImSimCSE's released code** (Xu et al. 2023): the positive logit is scaled by "
            f"{self.ratio:g} in the numerator and the denominator, instead of weighting the negatives."
        )

    def extra_repr(self) -> str:
        return f"ratio={self.ratio}"


def build(section: OffDropoutConfig, parts: Assembly) -> None:
    """``objective.off_dropout``: every negative scores in the off-dropout space; the paper's
    variant weights the negatives by ``m`` (Eq. 3), the authors' code scales the positive."""
    if not section.enabled:
        return
    parts.space = OFF_DROPOUT_SPACE
    parts.base = OffDropoutNegatives(section.tradeoff if section.variant == "paper" else 1.0)
    if section.variant == "authors_code":
        parts.score_wrappers.append(lambda score: PositiveRatioScore(score, section.tradeoff))
