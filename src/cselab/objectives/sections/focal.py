"""Focal-InfoNCE's section, ``objective.focal`` (Hou & Li 2023, Eq. 2).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.focal`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.schema import check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts


@dataclass
class FocalConfig:
    """Focal-InfoNCE (Hou & Li 2023, Eq. 2): positives score ``s²``, negatives ``s(s+m)``.

    Attributes:
        enabled: use Focal's score for every column (in-batch, Gaussian, mixed, off-dropout).
        hardness: ``m``; negatives with cosine above ``1 - m`` are up-weighted. Paper: 0.3
            (Table 5 searches 0.1-0.4). Must be in ``[0, 1]``.
    """

    enabled: bool = False
    hardness: float = 0.3

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.focal``."""
        check(finite(self.hardness) and 0 <= self.hardness <= 1,
              f"{_P}.focal.hardness must be in [0, 1]", self.hardness)  # fmt: skip
