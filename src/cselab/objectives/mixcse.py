"""MixCSE's mixed hard negatives (Zhang et al. 2022, "Unsupervised Sentence Representation via
Contrastive Learning with Mixing Negatives", Sec. MixCSE).

For anchor ``h_i`` with positive ``h'_i`` (both L2-normalised) and another sentence ``j`` of the
batch::

    h̃'_{ij} = (λ h'_i + (1-λ) h'_j) / ‖λ h'_i + (1-λ) h'_j‖
    L_mix   = -log( e^{h_iᵀh'_i/τ} / ( e^{h_iᵀh'_i/τ} + Σ_{j≠i} e^{h_iᵀh'_j/τ} + e^{h_iᵀ SG(h̃'_{ij})/τ} ) )

``SG`` is stop-gradient. "In practice both ``h_i`` and ``h'_i`` may serve as the anchor": with
``directions: both`` the objective is symmetric and the second direction mixes ``h_i`` and
``h_j``. Table 3's ablations are ``single`` (one direction) and ``wo_sg`` (no stop-gradient).

How the authors' released code differs (for ``columns='all'``, which offers its construction):

* it mixes the *unnormalised* pooled features (the paper mixes L2-normalised ones; cselab always
  mixes normalised features, as the paper says);
* it builds one mix per row by rolling the batch (``j = i + 1``) and appends *all* ``N`` mixes as
  columns for every anchor; the column whose ``(1-λ)`` part is the anchor's own positive is
  "removed" by multiplying its logit by 0, which leaves ``e⁰ = 1`` in the denominator. cselab
  masks it with ``-inf``;
* its second "direction" appends the transposed block (mixes of the first view against the second
  view's columns) to the first view's softmax rows instead of computing a loss with the second
  view as anchor.

Under a negative space other than ``dropout`` (see :mod:`cselab.objectives.spaces`) the mixes
are built from that space's candidates and compared with that space's anchor; e.g. with
off-dropout, ``normalize(λ z^off_i + (1-λ) z^off_j)`` against ``z^off_i``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import NegativeBlock, NegativeSource, Pair
from .context import ObjectiveContext
from .papers import Paper
from .sections.mixcse import MixCSEConfig
from .spaces import DROPOUT_SPACE, NegativeSpace

MIXCSE = Paper(
    key="zhang2022mixcse",
    name="MixCSE",
    summary="hard negatives mixed from an anchor's positive and another sentence, without gradient",
    bibtex="""@inproceedings{zhang2022mixcse,
  title     = {Unsupervised Sentence Representation via Contrastive Learning with Mixing Negatives},
  author    = {Zhang, Yanzhao and Zhang, Richong and Mensah, Samuel and Liu, Xudong and Mao, Yongyi},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  year      = {2022}
}""",
)


class MixedNegatives(NegativeSource):
    """MixCSE's mixed negatives as one extra block of columns.

    Args:
        mix_ratio: ``λ`` in ``[0, 1)``, the share of the anchor's own positive (paper: 0.2).
        partner: ``random`` (a uniformly drawn other sentence of the global batch, from
            ``ctx.generator`` if given) or ``next`` (``j = i + 1`` modulo the global batch).
        columns: ``one`` (one mix per anchor, the paper's ``L_mix``) or ``all`` (every rolled mix
            is a column for every anchor; the mix dominated by the anchor's own positive is
            masked). ``all`` requires ``partner='next'``.
        stop_gradient: detach the mixes (paper); ``False`` lets gradients flow into ``h'_i`` and
            ``h'_j`` through the mix (MixCSE_wo_sg).
        space: negative space whose candidates are mixed.
    """

    papers = (MIXCSE,)
    tags = ("mixcse",)

    def __init__(
        self,
        mix_ratio: float = MixCSEConfig.mix_ratio,
        partner: str = MixCSEConfig.partner,
        columns: str = MixCSEConfig.columns,
        stop_gradient: bool = MixCSEConfig.stop_gradient,
        space: NegativeSpace = DROPOUT_SPACE,
    ) -> None:
        super().__init__()
        assert columns == "one" or partner == "next", "validated by MixCSEConfig"
        self.mix_ratio = float(mix_ratio)
        self.partner = partner
        self.columns = columns
        self.stop_gradient = bool(stop_gradient)
        self.space = space
        self.required_views = space.required_views

    def mix(self, own: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        mixed = F.normalize(self.mix_ratio * own + (1 - self.mix_ratio) * other, dim=-1)
        return mixed.detach() if self.stop_gradient else mixed

    def partners(self, rows: torch.Tensor, n: int, ctx: ObjectiveContext) -> torch.Tensor:
        """Global index ``j ≠ rows[i]`` of each anchor's partner."""
        if self.partner == "next":
            return (rows + 1) % n
        # One draw per sentence of the global batch, then this rank's slice: the partners do not
        # depend on the number of ranks (the generator is seeded identically on every rank).
        gen = ctx.generator
        device = gen.device if gen is not None else rows.device
        draw = torch.randint(0, n - 1, (n,), generator=gen, device=device).to(rows.device)[rows]
        return draw + (draw >= rows).long()

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        anchor = self.space.anchor_of(pair)
        candidates = pair.cache.gather(ctx, self.space.local_candidates(pair))
        n = candidates.shape[0]
        if n < 2:
            raise ValueError("mixed negatives need at least 2 sentences in the (global) batch")
        rows = ctx.local_rows(anchor)
        if self.columns == "one":
            # The same partners j for both directions of a symmetric loss (the paper mixes
            # h_i with h_j "in the same way" for the second anchor).
            j = pair.cache.draw(("mixcse", id(self)), lambda: self.partners(rows, n, ctx))
            mixed = self.mix(candidates[rows], candidates[j])
            sims = (anchor * mixed).sum(-1, keepdim=True)
            return NegativeBlock(sims)
        k = torch.arange(n, device=anchor.device)
        nxt = (k + 1) % n
        mixed = self.mix(candidates, candidates[nxt])
        sims = anchor @ mixed.T
        # Column k mixes h'_k (share λ) with h'_{k+1} (share 1-λ): remove the column whose
        # (1-λ) part is the anchor's own positive.
        mask = nxt.unsqueeze(0) == rows.unsqueeze(1)
        return NegativeBlock(sims, mask=mask)

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            "**MixCSE** (Zhang et al. 2022): mixed hard negatives normalize(λh'ᵢ + (1 - λ)h'ⱼ) "
            f"with λ = {self.mix_ratio:g}, partner = {self.partner}, columns = {self.columns}, "
            f"stop-gradient = {str(self.stop_gradient).lower()}."
        )

    def extra_repr(self) -> str:
        return (
            f"mix_ratio={self.mix_ratio}, partner={self.partner}, columns={self.columns}, "
            f"stop_gradient={self.stop_gradient}, space={self.space.name}"
        )


def build(section: MixCSEConfig, parts: Assembly) -> None:
    """``objective.mixcse``: the mixed block (its ``directions`` make the loss symmetric:
    :attr:`~cselab.objectives.config.ObjectiveConfig.symmetric_loss`)."""
    x = section
    if x.enabled:
        parts.negatives.append(
            MixedNegatives(x.mix_ratio, x.partner, x.columns, x.stop_gradient, space=parts.space)
        )
