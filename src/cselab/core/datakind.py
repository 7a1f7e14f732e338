"""What kind of training data a run has: sentences, or pairs with a number of hard negatives.

Decided once, by the data layer when it opens the training file
(:class:`cselab.data.source.TrainingSource`), and handed to everything that depends on it: the
objective's build and checks, the views a step computes, the trainer and the model card. It lives
here, below every layer, because the objectives may not import the data layer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataKind:
    """The shape of the training data, as every layer above the data needs it.

    Attributes:
        pairs: the rows are given ``(anchor, positive)`` pairs (supervised SimCSE); ``False``:
            raw sentences, each its own positive through two dropout views (unsupervised).
        negatives: ``K``, the given hard-negative columns of every pair (0 for sentences).
    """

    pairs: bool = False
    negatives: int = 0

    def __post_init__(self) -> None:
        if self.negatives < 0 or (self.negatives and not self.pairs):
            raise ValueError(f"hard negatives need pairs data: {self}")

    @property
    def hard_negatives(self) -> bool:
        """Whether every row carries given hard negatives (the ``neg`` view)."""
        return self.negatives > 0

    @property
    def unit(self) -> str:
        """What one row is, in words: ``sentences`` or ``pairs``."""
        return "pairs" if self.pairs else "sentences"


#: Raw sentences, the unsupervised default.
SENTENCES = DataKind()
