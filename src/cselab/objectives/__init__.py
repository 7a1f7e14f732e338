"""Training objectives. The trainer only uses :func:`build_objective` and :class:`Objective`."""

from __future__ import annotations

from .base import (
    AuxiliaryTerm,
    ContrastiveObjective,
    InBatchNegatives,
    LossTerms,
    NegativeBlock,
    NegativeSource,
    Objective,
    ObjectiveContext,
    Pair,
    Score,
    total_loss,
)
from .config import ObjectiveConfig
from .infonce import infonce


def build_objective(cfg: ObjectiveConfig) -> Objective:
    """Assemble the objective described by ``cfg`` (validated first)."""
    cfg.validate()
    return infonce(cfg.temperature, symmetric=cfg.symmetric)


__all__ = [
    "AuxiliaryTerm",
    "ContrastiveObjective",
    "InBatchNegatives",
    "LossTerms",
    "NegativeBlock",
    "NegativeSource",
    "Objective",
    "ObjectiveConfig",
    "ObjectiveContext",
    "Pair",
    "Score",
    "build_objective",
    "infonce",
    "total_loss",
]
