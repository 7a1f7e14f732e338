"""Negative spaces: which views stand for the anchor and the candidates on the negative side.

Every negative column of :class:`~cselab.objectives.infonce.InfoNCE` is scored in one space:

====================  ==========================  ===================================
space                 anchor side                 candidate pool
====================  ==========================  ===================================
``dropout`` (SimCSE)  ``z¹_i``                    ``z²`` of the (global) batch
``off`` (ImSimCSE)    ``z^off_i``                 ``z^off`` of the (global) batch
``noisy`` (Table 1)   ``z¹_i + g¹``               ``z² + g²``
====================  ==========================  ===================================

In-batch, Gaussian and mixed negatives all use the objective's one space, so e.g. with off-dropout
*and* MixCSE the mixes are built from off-dropout representations and scored against ``z^off_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .base import VIEW_ANCHOR, VIEW_OFF_DROPOUT, VIEW_POSITIVE, Pair

VIEW_ANCHOR_NOISY = "z1+noise"
VIEW_POSITIVE_NOISY = "z2+noise"

#: Views that objectives derive themselves from others (never asked from the encoder).
DERIVED_VIEWS = frozenset({VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY})

#: How view names are exchanged when the second view becomes the anchor (``off`` is shared).
SWAPPED_NAMES = {
    VIEW_ANCHOR: VIEW_POSITIVE,
    VIEW_POSITIVE: VIEW_ANCHOR,
    VIEW_ANCHOR_NOISY: VIEW_POSITIVE_NOISY,
    VIEW_POSITIVE_NOISY: VIEW_ANCHOR_NOISY,
}


@dataclass(frozen=True)
class NegativeSpace:
    """Which normalised views stand for the anchor and the candidates on the negative side."""

    name: str
    anchor: str
    candidates: str

    @property
    def required_views(self) -> frozenset[str]:
        return frozenset({VIEW_ANCHOR, VIEW_POSITIVE, self.anchor, self.candidates}) - DERIVED_VIEWS

    def anchor_of(self, pair: Pair) -> Tensor:
        return pair.views[self.anchor]

    def local_candidates(self, pair: Pair) -> Tensor:
        return pair.views[self.candidates]


DROPOUT_SPACE = NegativeSpace("dropout", VIEW_ANCHOR, VIEW_POSITIVE)
OFF_DROPOUT_SPACE = NegativeSpace("off", VIEW_OFF_DROPOUT, VIEW_OFF_DROPOUT)
NOISY_SPACE = NegativeSpace("noisy", VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY)
