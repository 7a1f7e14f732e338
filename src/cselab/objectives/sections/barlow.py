"""The BarlowTwins term's section, ``objective.barlow_twins`` (Xu et al. 2023, Eq. 4).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.barlow`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.schema import check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts


@dataclass
class BarlowTwinsConfig:
    """BarlowTwins as an additive term (Xu et al. 2023, Eq. 4, Table 2; Zbontar et al. 2021).

    ``weight × [Σ_c (1 - C_cc)² + λ_BT Σ_{c≠d} C_cd²]`` with ``C`` the cross-correlation of the
    two views over the batch (the paper's leading minus sign is a typo: the term is minimised).

    Attributes:
        enabled: add the term ``barlow_twins``.
        weight: factor on the whole term (the paper does not report it; 1.0).
        off_diagonal: ``λ_BT`` (BarlowTwins' 5e-3).
        padding: ``M`` standard-Gaussian artificial embeddings appended to the batch before
            computing ``C`` (Table 2: 100, 300, 704); the same rows pad both views.
        center: subtract each dimension's batch mean first (BarlowTwins' batch standardisation).
            ``false`` is Eq. 4 as printed (cosine similarity between dimension columns).
    """

    enabled: bool = False
    weight: float = 1.0
    off_diagonal: float = 5e-3
    padding: int = 0
    center: bool = False

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.barlow_twins``."""
        b = self
        check(finite(b.weight) and b.weight >= 0, f"{_P}.barlow_twins.weight must be >= 0",
               b.weight)  # fmt: skip
        check(finite(b.off_diagonal) and b.off_diagonal >= 0,
               f"{_P}.barlow_twins.off_diagonal must be >= 0", b.off_diagonal)  # fmt: skip
        check(b.padding >= 0, f"{_P}.barlow_twins.padding must be >= 0", b.padding)
