"""BarlowTwins as an additive term: ImSimCSE's baseline (Xu et al. 2023, Eq. 4, Table 2).

Cross-correlation of the two views over the batch, ``C ∈ R^{D×D}``::

    C_cd = Σ_i z¹_{ic} z²_{id} / ( sqrt(Σ_i (z¹_{ic})²) · sqrt(Σ_i (z²_{id})²) )
    ℓ_BT = Σ_c (1 - C_cc)² + λ_BT Σ_c Σ_{d≠c} C_cd²

(the paper prints a leading minus sign on the first sum; that is a typo: BarlowTwins minimises
both sums, ``λ_BT = 5e-3`` as in Zbontar et al. 2021). ``C`` is a product of a ``D×N`` and an
``N×D`` matrix, so ``rank(C) ≤ min(N, D)``: with batch 64 and width 768 the identity target is out
of reach — the paper's *rank bottleneck*. Table 2 pads the batch with ``M`` standard-Gaussian
artificial embeddings before computing ``C`` (rank ``≤ min(N+M, D)``; 704 = 768 - 64 removes the
bound). The same artificial rows pad both views: they are artificial *sentences*, without dropout.

``center=True`` subtracts each dimension's batch mean first (BarlowTwins' batch standardisation);
the default is Eq. 4 as printed. Under data parallelism ``C`` uses the gathered batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import VIEW_ANCHOR, VIEW_POSITIVE, AuxiliaryTerm, upcast
from .context import ObjectiveContext, StepCache
from .off_dropout import IMSIMCSE
from .papers import Paper
from .sections.barlow import BarlowTwinsConfig

BARLOW_TWINS = Paper(
    key="zbontar2021barlow",
    name="Barlow Twins",
    summary="redundancy reduction: the cross-correlation of two views is pushed to the identity",
    bibtex="""@inproceedings{zbontar2021barlow,
  title     = {Barlow Twins: Self-Supervised Learning via Redundancy Reduction},
  author    = {Zbontar, Jure and Jing, Li and Misra, Ishan and LeCun, Yann and Deny, St{\\'e}phane},
  booktitle = {Proceedings of the 38th International Conference on Machine Learning (ICML)},
  year      = {2021}
}""",
)


def cross_correlation(z1: Tensor, z2: Tensor, center: bool = False, eps: float = 1e-8) -> Tensor:
    """``C`` of Eq. 4 for ``(N, D)`` views (columns normalised over the rows)."""
    a, b = upcast(z1), upcast(z2)
    if center:
        a = a - a.mean(dim=0, keepdim=True)
        b = b - b.mean(dim=0, keepdim=True)
    a = a / a.norm(dim=0, keepdim=True).clamp_min(eps)
    b = b / b.norm(dim=0, keepdim=True).clamp_min(eps)
    return a.T @ b


def barlow_twins_loss(c: Tensor, off_diagonal: float = 5e-3) -> Tensor:
    """``Σ_c (1 - C_cc)² + λ_BT Σ_{c≠d} C_cd²``."""
    diag = c.diagonal()
    on = (1 - diag).pow(2).sum()
    off = c.pow(2).sum() - diag.pow(2).sum()
    return on + off_diagonal * off


class BarlowTwinsTerm(AuxiliaryTerm):
    """``weight × ℓ_BT`` on the two dropout views, reported as the term ``barlow_twins``.

    Args:
        weight: factor on the term (not reported by the paper; 1.0).
        off_diagonal: ``λ_BT`` (5e-3).
        padding: ``M`` standard-Gaussian rows appended to both views (fresh each step, same on
            every rank, no gradient; drawn from ``ctx.generator`` when given).
        center: subtract the batch mean of each dimension before normalising.
    """

    name = "barlow_twins"
    papers = (IMSIMCSE, BARLOW_TWINS)  # ImSimCSE's baseline (Eq. 4, Table 2)
    tags = ("barlow-twins",)

    def __init__(
        self,
        weight: float = BarlowTwinsConfig.weight,
        off_diagonal: float = BarlowTwinsConfig.off_diagonal,
        padding: int = BarlowTwinsConfig.padding,
        center: bool = BarlowTwinsConfig.center,
    ) -> None:
        super().__init__()
        self.weight = float(weight)
        self.off_diagonal = float(off_diagonal)
        self.padding = int(padding)
        self.center = bool(center)

    def padded_views(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext, cache: StepCache | None = None
    ) -> tuple[Tensor, Tensor]:
        """The gathered views with the artificial rows appended, ``(N + M, D)`` each."""
        cache = cache or StepCache()
        z1 = upcast(cache.gather(ctx, views[VIEW_ANCHOR]))
        z2 = upcast(cache.gather(ctx, views[VIEW_POSITIVE]))
        if self.padding:
            pad = ctx.normal(self.padding, z1.shape[1], z1)
            z1 = torch.cat([z1, pad], dim=0)
            z2 = torch.cat([z2, pad], dim=0)
        return z1, z2

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext, cache: StepCache | None = None
    ) -> Tensor:
        z1, z2 = self.padded_views(views, ctx, cache)
        c = cross_correlation(z1, z2, self.center)
        return self.weight * barlow_twins_loss(c, self.off_diagonal)

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            f"**BarlowTwins term** (Zbontar et al. 2021; ImSimCSE Eq. 4): weight {self.weight:g}, "
            f"off-diagonal λ_BT = {self.off_diagonal:g}, padding M = {self.padding}, "
            f"centred = {str(self.center).lower()}."
        )

    def extra_repr(self) -> str:
        return (
            f"weight={self.weight}, off_diagonal={self.off_diagonal}, padding={self.padding}, "
            f"center={self.center}"
        )


def build(section: BarlowTwinsConfig, parts: Assembly) -> None:
    """``objective.barlow_twins``: the BarlowTwins term, unless its weight is 0."""
    b = section
    if b.enabled and b.weight > 0:
        parts.auxiliary.append(BarlowTwinsTerm(b.weight, b.off_diagonal, b.padding, b.center))
