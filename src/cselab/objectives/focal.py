"""Focal-InfoNCE (Hou & Li 2023, Eq. 2).

For anchor ``i`` with positive cosine ``s_p`` and negative cosines ``s_n^{ij}``::

    l_i = -log( e^{s_p²/τ} / ( Σ_{j≠i} e^{s_n^{ij}(s_n^{ij}+m)/τ} + e^{s_p²/τ} ) )

and the batch loss is the mean over anchors (the paper's Eq. 3 writes the sum; the mean only
rescales the learning rate and is what the authors' code computes).

Gradients. With ``Z_i`` the denominator:

* ``∂l_i/∂s_p = (2/τ)(e^{s_p²/τ}/Z_i - 1)·s_p`` (the paper's Eq. 5, correct);
* ``∂l_i/∂s_n^{ij} = (1/τ)(e^{s_n(s_n+m)/τ}/Z_i)·(2s_n + m)``. The paper's Eq. 4 prints the
  factor as ``2(s_n + m)``, but the derivative of ``s_n(s_n + m)`` is ``2s_n + m``; autograd of
  this module matches the correct form (tested).

Temperature: the paper's text lists τ = {0.7, 0.7, 0.5, 0.5} for BERT-base/large and
RoBERTa-base/large, but its own ablation (Table 4) varies τ over 0.03-0.1 with the best results at
0.05-0.07, and the authors' released scripts use 0.05; cselab's presets use 0.05.
"""

from __future__ import annotations

from torch import Tensor

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import Score
from .papers import Paper
from .sections.focal import FocalConfig

FOCAL_INFONCE = Paper(
    key="hou2023focal",
    name="Focal-InfoNCE",
    summary="up-weights hard negatives: positives score s², negatives s(s + m)",
    bibtex="""@inproceedings{hou2023focal,
  title     = {Improving Contrastive Learning of Sentence Embeddings with Focal-{InfoNCE}},
  author    = {Hou, Pengyue and Li, Xingyu},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2023},
  year      = {2023}
}""",
)


class FocalScore(Score):
    """Focal-InfoNCE's energies: ``s²`` for the positive, ``s(s+m)`` for every negative column.

    Applied to every negative block of the objective (in-batch, off-dropout, Gaussian, mixed).

    Args:
        hardness: ``m`` in ``[0, 1]`` (checked by :class:`~cselab.objectives.config.FocalConfig`) (paper: 0.3); negatives with ``s > 1 - m`` gain energy.

    Example::

        >>> import torch
        >>> FocalScore(0.3).negative(torch.tensor([0.5]))
        tensor([0.4000])
    """

    papers = (FOCAL_INFONCE,)
    tags = ("focal-infonce",)

    def __init__(self, hardness: float = FocalConfig.hardness) -> None:
        super().__init__()
        self.hardness = float(hardness)

    def positive(self, sim: Tensor) -> Tensor:
        return sim * sim

    def negative(self, sim: Tensor) -> Tensor:
        return sim * (sim + self.hardness)

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            "**Focal-InfoNCE** (Hou & Li 2023, Eq. 2): positives score s², negatives s(s + m), "
            f"which up-weights hard negatives; hardness m = {self.hardness:g}."
        )

    def extra_repr(self) -> str:
        return f"hardness={self.hardness}"


def build(section: FocalConfig, parts: Assembly) -> None:
    """``objective.focal``: Focal's score for every column."""
    if section.enabled:
        parts.score = FocalScore(section.hardness)
