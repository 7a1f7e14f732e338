"""The train step's computation: ``losses = task(batch)``.

A :class:`Task` ties an encoder, an objective and the objective's context together and turns one
:class:`Batch` into named loss terms: batch → views (:mod:`cselab.training.views`, under the
run's autocast) → objective → ``{term: scalar}``. The trainer, GradCache and the benchmarks all
call it; none of them repeats the sequence. The trainer owns everything around it (the data, the
backward, the optimiser, checkpoints), so a new kind of step — pairs with hard negatives, a
different set of views — is a new task, never a trainer change.

Two hooks serve objectives with state across steps (ESimCSE, Wu et al. 2022): the task owns the
momentum encoder of the ``momentum`` view (:mod:`.momentum`), which the trainer advances with
:meth:`Task.after_step` after every optimiser step; and :meth:`Task.losses` calls the
objective's ``on_step_end`` once per step, after the loss (the queue takes in the step's batch
there, once per step also under GradCache). :meth:`Task.state_dict` is what the checkpoint keeps
of both. :meth:`Task.prepare` hands the batch to the objective's own ``prepare`` hook once per
step (the token-level views it makes on the host: ESimCSE's repeated positive, MNTP's masked
copy), with a seed from ``(seed, step)`` and this rank's offset: the same draws on every rank,
under GradCache and after a resume. The task knows no paper: what it asks of an objective is
its views, their settings, ``setup`` and ``prepare``.

Example::

    >>> task = Task(encoder, build_objective(ObjectiveConfig()))  # doctest: +SKIP
    >>> losses = task(Batch(step=0, inputs=encoder.tokenize(["a", "b"])))  # doctest: +SKIP
    >>> total_loss(losses).backward()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core.datakind import SENTENCES, DataKind
from ..data.inputs import StepInputs, as_step_inputs
from ..model.devices import autocast
from ..objectives import (
    VIEW_MOMENTUM,
    LossTerms,
    Objective,
    ObjectiveContext,
    PrepareContext,
)
from .momentum import MomentumEncoder
from .rng import objective_seed
from .views import check_views, compute_views


@dataclass
class Batch:
    """One step's data on this rank.

    Attributes:
        step: the index of the step; it seeds the objective's generated negatives, so that every
            rank, GradCache and a resumed run draw the same ones.
        inputs: the step's token columns (:class:`~cselab.data.inputs.StepInputs`); a plain
            token dict (``input_ids``, ``attention_mask``, ... ``(B, L)``) is taken as a
            sentence batch.
        prepared: whether :meth:`Task.prepare` has run on it (it runs once per step).
        tokens: ``(real, padded)`` tokens of its columns, counted on the host before the copy
            (:meth:`~cselab.data.inputs.StepInputs.token_counts`); ``None``: not counted.
    """

    step: int
    inputs: StepInputs
    prepared: bool = False
    tokens: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.inputs = as_step_inputs(self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)

    def rows(self, start: int, end: int) -> StepInputs:
        """The inputs of rows ``start:end``, at the batch's padded widths."""
        return self.inputs.rows(start, end)


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
        graphs: ``encoder`` replays CUDA graphs (``torch.compile`` ``reduce-overhead`` on a
            GPU): each step then starts a new generation of its graphs' memory explicitly
            (:func:`~.step.forward_backward`), so every output of a step's encoder calls
            (GradCache's chunks included) lives until the step ends. The mark is
            process-wide: from the first one on, torch no longer starts generations by
            itself, so another ``reduce-overhead`` model in the same process must call
            ``torch.compiler.cudagraph_mark_step_begin()`` itself.
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
        graphs: bool = False,
    ) -> None:
        check_views(objective.required_views, kind)
        self.kind, self.graphs = kind, graphs
        self.encoder = encoder
        self.objective = objective
        self.ctx = ctx or ObjectiveContext()
        self.seed = seed
        self.amp_dtype = amp_dtype
        objective.setup(getattr(self._raw, "tokenizer", None))  # once: e.g. MNTP's mask token
        self.momentum: MomentumEncoder | None = None
        if VIEW_MOMENTUM in objective.required_views:
            settings = objective.view_settings[VIEW_MOMENTUM]
            self.momentum = MomentumEncoder(
                self._raw, settings.momentum, init=settings.init, seed=seed
            )

    @property
    def _raw(self) -> nn.Module:
        """The encoder itself (torch.compile's wrapper: its module)."""
        return getattr(self.encoder, "_orig_mod", self.encoder)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of the encoder passes."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return autocast(next(self.encoder.parameters()).device, self.amp_dtype)

    def prepare(self, batch: Batch) -> Batch:
        """``batch`` with what the step's views need besides its tokens, made by the objective's
        ``prepare`` hook (a word-repeated positive, a masked copy). Called once per step on the
        whole local batch, before any encoding (GradCache chunks the result); the trainer calls
        it on the CPU batch, before the copy to the device (both are host work). A prepared
        batch passes through unchanged (the same object), and so does one the objective adds
        nothing to (marked prepared)."""
        if batch.prepared:
            return batch
        seed = self.seed if self.seed is not None else 0
        ctx = PrepareContext(objective_seed(seed, batch.step), self.ctx.offset, self.kind)
        inputs = self.objective.prepare(batch.inputs, ctx)
        if inputs is batch.inputs:
            batch.prepared = True
            return batch
        return Batch(batch.step, inputs, prepared=True)

    def encode(
        self, inputs: StepInputs | Mapping[str, Tensor], names: Collection[str] | None = None
    ) -> dict[str, Tensor]:
        """The views the objective asks for (``names``: only these of them), of ``inputs`` (all
        rows, or one GradCache chunk; a plain token dict is a sentence batch)."""
        names = self.objective.required_views if names is None else names
        with self.autocast():
            return compute_views(self.encoder, inputs, names, self.kind, self.momentum)

    def losses(self, views: Mapping[str, Tensor], step: int) -> LossTerms:
        """The objective's named terms for the views of step ``step`` (the whole local batch);
        then the objective's ``on_step_end`` (once per step)."""
        if self.seed is not None and self.ctx.generator is not None:
            self.ctx.generator.manual_seed(objective_seed(self.seed, step))
        terms = self.objective(views, self.ctx)
        self.objective.on_step_end(views, self.ctx)
        return terms

    def after_step(self) -> None:
        """After the optimiser step: advance the momentum encoder (if any)."""
        if self.momentum is not None:
            self.momentum.update()

    def state_dict(self) -> dict[str, Tensor]:
        """What the task keeps across steps besides the model: the objective's run state and
        the momentum encoder's weights (empty for most objectives)."""
        state = {f"objective.{k}": v for k, v in self.objective.run_state().items()}
        if self.momentum is not None:
            state.update({f"momentum.{k}": v for k, v in self.momentum.state_dict().items()})
        return state

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Restore :meth:`state_dict`'s tensors."""

        def part(prefix: str) -> dict[str, Tensor]:
            return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}

        self.objective.load_run_state(part("objective."))
        if self.momentum is not None:
            self.momentum.load_state_dict(part("momentum."))

    def __call__(self, batch: Batch) -> LossTerms:
        batch = self.prepare(batch)
        return self.losses(self.encode(batch.inputs), batch.step)
