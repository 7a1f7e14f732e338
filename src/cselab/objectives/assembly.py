"""The parts of one :class:`~cselab.objectives.infonce.InfoNCE` while the registry assembles it.

:func:`cselab.objectives.registry.build_objective` hands one :class:`Assembly` to each paper
module's ``build`` in the registry's order; each adds or replaces its part (a negative block, the
score, an auxiliary term, a view transform, a wrapper), and :meth:`Assembly.finish` builds the
loss by :mod:`.infonce`'s composition rules (the negative space is chosen before any block is
added; the blocks keep the registry's column order; score wrappers apply after the score).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..core.datakind import DataKind
from .base import (
    VIEW_ANCHOR,
    VIEW_POSITIVE,
    AuxiliaryTerm,
    InputPart,
    NegativeSource,
    Objective,
    Score,
)
from .config import ObjectiveConfig
from .infonce import InBatchNegatives, InfoNCE
from .spaces import DROPOUT_SPACE, NegativeSpace


@dataclass
class Assembly:
    """An objective being assembled from ``config`` for training data of kind ``data``.

    Attributes:
        config: the validated ``objective:`` section.
        data: the kind of the training data (``None``: not known, as for a config built in
            Python without data).
        space: the negative space every block scores in (noise or off-dropout replace it).
        base: the first negative block; ``None``: in-batch negatives in ``space`` (SimCSE).
        negatives: the further negative blocks, in column order.
        score: how cosine similarity becomes an energy (plain: SimCSE).
        score_wrappers: applied to ``score`` in order, after every part has been built.
        auxiliary: additive terms on the raw views.
        transforms: view transforms applied before normalisation.
        positive_views: the two views of the positive column.
        inputs: the parts that make token-level views on the host (ESimCSE's repeated
            positive), in order.
        wrappers: applied to the built InfoNCE in order (Matryoshka).
        replacement: an objective that replaces InfoNCE altogether (MNTP, a language-modelling
            loss; every other part is off then).
    """

    config: ObjectiveConfig
    data: DataKind | None = None
    space: NegativeSpace = DROPOUT_SPACE
    base: NegativeSource | None = None
    negatives: list[NegativeSource] = field(default_factory=list)
    score: Score = field(default_factory=Score)
    score_wrappers: list[Callable[[Score], Score]] = field(default_factory=list)
    auxiliary: list[AuxiliaryTerm] = field(default_factory=list)
    transforms: list[nn.Module] = field(default_factory=list)
    positive_views: tuple[str, str] = (VIEW_ANCHOR, VIEW_POSITIVE)
    inputs: list[InputPart] = field(default_factory=list)
    wrappers: list[Callable[[Objective], Objective]] = field(default_factory=list)
    replacement: Objective | None = None

    def finish(self) -> Objective:
        """The objective the parts describe."""
        if self.replacement is not None:
            return self.replacement
        base = self.base if self.base is not None else InBatchNegatives(self.space)
        score = self.score
        for wrap in self.score_wrappers:
            score = wrap(score)
        objective: Objective = InfoNCE(
            self.config.temperature,
            [base, *self.negatives],
            score=score,
            auxiliary=self.auxiliary,
            symmetric=self.config.symmetric_loss,
            transforms=self.transforms,
            positive_views=self.positive_views,
            inputs=self.inputs,
        )
        for wrap in self.wrappers:
            objective = wrap(objective)
        return objective
