"""The train step's computation: ``losses = task(batch)``.

A :class:`Task` ties an encoder, an objective and the objective's context together and turns one
:class:`Batch` into named loss terms: batch → views (:mod:`cselab.training.views`, under the
run's autocast) → objective → ``{term: scalar}``. The trainer, GradCache and the benchmarks all
call it; none of them repeats the sequence. The trainer owns everything around it (the data, the
backward, the optimiser, checkpoints), so a new kind of step — pairs with hard negatives, a
different set of views — is a new task, never a trainer change.

Example::

    >>> task = Task(encoder, build_objective(ObjectiveConfig()))  # doctest: +SKIP
    >>> losses = task(Batch(step=0, inputs=encoder.tokenize(["a", "b"])))  # doctest: +SKIP
    >>> total_loss(losses).backward()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core.datakind import SENTENCES, DataKind
from ..objectives import LossTerms, Objective, ObjectiveContext
from .rng import objective_seed
from .views import check_views, compute_views


@dataclass
class Batch:
    """One step's data on this rank.

    Attributes:
        step: the index of the step; it seeds the objective's generated negatives, so that every
            rank, GradCache and a resumed run draw the same ones.
        inputs: token tensors (``input_ids``, ``attention_mask``, ...), ``(B, L)`` each.
    """

    step: int
    inputs: Mapping[str, Tensor]

    def __len__(self) -> int:
        return next(iter(self.inputs.values())).shape[0]

    def rows(self, start: int, end: int) -> dict[str, Tensor]:
        """The inputs of rows ``start:end``, at the batch's padded width."""
        return {k: v[start:end] for k, v in self.inputs.items()}


class Task:
    """Encoder + objective + context → ``losses = task(batch)``.

    Args:
        encoder: the model that produces the views (``encoder(**inputs) -> (n, D)``); may be a
            ``torch.compile`` wrapper of the :class:`~cselab.model.encoder.SentenceEncoder`.
        objective: any :class:`~cselab.objectives.Objective`.
        ctx: the objective's context (gather, rank, offset, generator); default: one process.
        seed: the run's seed: ``ctx.generator`` is re-seeded from ``(seed, batch.step)`` before
            each step. ``None``: the generator is left as the caller set it.
        amp_dtype: autocast dtype of the encoder passes (``None``: full precision). The
            objective runs outside autocast and upcasts half-precision views itself.
        kind: the kind of the training data (default: sentences), as the data layer decided it;
            the views the objective asks for are checked against it once, here.
    """

    def __init__(
        self,
        encoder: nn.Module,
        objective: Objective,
        ctx: ObjectiveContext | None = None,
        *,
        seed: int | None = None,
        amp_dtype: torch.dtype | None = None,
        kind: DataKind = SENTENCES,
    ) -> None:
        check_views(objective.required_views, kind)
        self.kind = kind
        self.encoder = encoder
        self.objective = objective
        self.ctx = ctx or ObjectiveContext()
        self.seed = seed
        self.amp_dtype = amp_dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of the encoder passes."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        device = next(self.encoder.parameters()).device
        return torch.autocast(device.type, dtype=self.amp_dtype)

    def encode(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The views the objective asks for, of ``inputs`` (all rows, or one GradCache chunk)."""
        with self.autocast():
            return compute_views(self.encoder, inputs, self.objective.required_views, self.kind)

    def losses(self, views: Mapping[str, Tensor], step: int) -> LossTerms:
        """The objective's named terms for the views of step ``step``."""
        if self.seed is not None and self.ctx.generator is not None:
            self.ctx.generator.manual_seed(objective_seed(self.seed, step))
        return self.objective(views, self.ctx)

    def __call__(self, batch: Batch) -> LossTerms:
        return self.losses(self.encode(batch.inputs), batch.step)
