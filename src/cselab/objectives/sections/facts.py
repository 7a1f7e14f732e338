"""What every objective section's checks share: the key root and :class:`ObjectiveFacts`.

Torch-free; the sections of :mod:`cselab.objectives.sections` and the assembly of the whole
``objective:`` section (:mod:`cselab.objectives.config`) import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.schema import finite

#: the root of every key named in the sections' messages
PREFIX = "objective"


def positive(x: float) -> bool:
    """Whether ``x`` is finite and ``> 0``."""
    return finite(x) and x > 0


@dataclass(frozen=True)
class ObjectiveFacts:
    """What a section's checks may know besides its own values.

    Attributes:
        objective: the whole section, an :class:`~cselab.objectives.config.ObjectiveConfig`
            (a combination of two sub-sections is refused by one).
        pairs: whether the training data are given pairs (``None``: not known yet).
        hard_negatives: whether the pairs carry hard negatives (``None``: not known yet).
        width: the encoder's output width (``None``: not known yet).
    """

    objective: Any
    pairs: bool | None = None
    hard_negatives: bool | None = None
    width: int | None = None
