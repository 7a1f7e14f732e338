"""GS-InfoNCE's Gaussian negatives (Wu et al., "Smoothed Contrastive Learning", Eq. 5).

``M`` vectors ``g_k ~ N(μ, σ²)`` of the embedding width are drawn fresh every step and used only
as extra negatives of each anchor, never as anchors or positives::

    l_i = -log( e^{sim(h_i,h_i⁺)/τ} / ( Σ_j e^{sim(h_j,h_i)/τ} + λ Σ_k e^{sim(g_k,h_i)/τ} ) )

``λ`` is applied exactly: ``log λ`` is added to the Gaussian columns' logits (the authors' code
declares ``λ`` but never uses it, i.e. always runs ``λ = 1``).

With ``μ = 0``, ``σ`` has no effect: the cosine similarity is scale invariant and ``g/σ`` is
standard normal, so only the direction of ``g`` matters.
"""

from __future__ import annotations

import math

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import NegativeBlock, NegativeSource, Pair
from .context import ObjectiveContext
from .papers import Paper
from .sections.gaussian import GaussianConfig
from .spaces import DROPOUT_SPACE, NegativeSpace

GS_INFONCE = Paper(
    key="wu2022smoothed",
    name="GS-InfoNCE",
    summary="Gaussian noise vectors as extra negatives, smoothing the negatives' distribution",
    bibtex="""@inproceedings{wu2022smoothed,
  title     = {Smoothed Contrastive Learning for Unsupervised Sentence Embedding},
  author    = {Wu, Xing and Gao, Chaochen and Zang, Liangjun and Han, Jizhong and Wang, Zhongyuan and Hu, Songlin},
  booktitle = {Proceedings of the 29th International Conference on Computational Linguistics (COLING)},
  year      = {2022}
}""",
)


class GaussianNegatives(NegativeSource):
    """``M`` fresh Gaussian vectors per step as extra, weighted negative columns.

    Args:
        num: ``M``; ``None`` means ``round(batch_multiple × N)`` with ``N`` the global batch.
        batch_multiple: see ``num`` (paper: 3).
        mean: ``μ`` of every coordinate.
        std: ``σ`` (> 0); irrelevant when ``mean == 0``.
        weight: ``λ`` (> 0; a weight of 0 is expressed by not adding the source).
        space: whose representation of the anchor is compared with the ``g_k``.

    The draws use ``ctx.generator`` when given (reproducible, resumable), else the global RNG;
    every rank draws all ``M`` vectors (the same ones: the trainer seeds the generator
    identically on every rank), once per step (both directions of a symmetric loss share them).
    They carry no gradient.
    """

    papers = (GS_INFONCE,)
    tags = ("gs-infonce",)

    def __init__(
        self,
        num: int | None = GaussianConfig.num,
        batch_multiple: float = GaussianConfig.batch_multiple,
        mean: float = GaussianConfig.mean,
        std: float = GaussianConfig.std,
        weight: float = GaussianConfig.weight,
        space: NegativeSpace = DROPOUT_SPACE,
    ) -> None:
        super().__init__()
        self.num = num
        self.batch_multiple = float(batch_multiple)
        self.mean = float(mean)
        self.std = float(std)
        self.weight = float(weight)
        self.space = space
        self.required_views = space.required_views

    def count(self, global_batch: int) -> int:
        """``M`` for a global batch of ``global_batch`` sentences."""
        if self.num is not None:
            return self.num
        return int(round(self.batch_multiple * global_batch))

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        anchor = self.space.anchor_of(pair)
        m = self.count(ctx.global_rows(anchor))
        noise = pair.cache.draw(
            ("gaussian", id(self)),
            lambda: ctx.normal(m, anchor.shape[1], anchor, self.mean, self.std),
        )
        noise = noise / noise.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        sims = anchor @ noise.T
        return NegativeBlock(sims, math.log(self.weight))

    def describe(self, kind: DataKind = SENTENCES) -> str:
        count = (
            f"M = {self.num}"
            if self.num is not None
            else f"M = {self.batch_multiple:g} × batch size"
        )
        return (
            f"**GS-InfoNCE** (Wu et al. 2022, Eq. 5): Gaussian noise vectors N(μ = {self.mean:g}, "
            f"σ = {self.std:g}) as extra negatives, {count}, weight λ = {self.weight:g}."
        )

    def extra_repr(self) -> str:
        m = self.num if self.num is not None else f"{self.batch_multiple}×batch"
        return f"M={m}, mean={self.mean}, std={self.std}, weight={self.weight}"


def build(section: GaussianConfig, parts: Assembly) -> None:
    """``objective.gaussian``: the Gaussian block, unless it would add no column or weight."""
    g = section
    if g.enabled and g.weight > 0 and (g.num if g.num is not None else g.batch_multiple) > 0:
        parts.negatives.append(
            GaussianNegatives(g.num, g.batch_multiple, g.mean, g.std, g.weight, space=parts.space)
        )
