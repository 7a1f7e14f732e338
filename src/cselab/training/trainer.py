"""The training loop: ``train_step`` on each batch; log, evaluate, checkpoint at their cadences.

It knows no objective (:func:`~.step.train_step` is the whole step) and no config: its
cadences are a :class:`LoopSettings`, its resolved facts the :class:`~cselab.config.plan.RunPlan`,
what a run keeps on disk (model folders, checkpoints, a resume) is :class:`~.runstate.RunState`'s,
and what leaves the run (``results.json``, the cards, the merged model, the Hub upload) is
written by callbacks. :func:`cselab.app.train.build_trainer` assembles it: it only loops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import torch

from ..config import save_config
from ..config.plan import RunPlan
from ..io.runfolder import RunFolder
from ..objectives import LossTerms
from .callbacks import CallbackList, split_row
from .checkpoint import copy_model_folder
from .distributed import barrier, broadcast_object, check_same_on_all_ranks
from .metrics import LossWindow, MetricsLog, Progress
from .optim import Optimization
from .runstate import RunState, RunTotals
from .runtime import precision_dtype
from .step import forward_backward, train_step, update
from .task import Batch, Task

log = logging.getLogger("cselab")


@dataclass(frozen=True)
class LoopSettings:
    """The loop's cadences (built from the ``train`` section by :mod:`cselab.app.train`).

    Attributes:
        total_steps, steps_per_epoch: the run's optimiser steps, and one epoch's (logged).
        batch_size: the global batch (the logged throughput counts its sentences).
        log_steps: a training row every this many steps.
        eval_steps: model selection every this many steps, and before the first (0: never).
        save_steps, save_minutes: a checkpoint every this many steps, else (0) minutes.
        chunk: GradCache's chunk of rows (0: the whole batch in one pass).
        resume: continue from the run folder's checkpoint when there is one.
    """

    total_steps: int
    steps_per_epoch: int
    batch_size: int
    log_steps: int = 1
    eval_steps: int = 0
    save_steps: int = 0
    save_minutes: float = 0.0
    chunk: int = 0
    resume: bool = False


class Trainer:
    """Runs the optimisation loop with the collaborators it is handed; it builds none of them
    (:func:`cselab.app.train.assemble_trainer` does).

    Args:
        task: the step's computation (the encoder's forward, possibly compiled, the objective
            and its context).
        optim: the optimiser, scheduler and loss scaling of the trainable parameters.
        batches: ``batches(start)``, the ready batches (on the device) from step ``start`` on
            (:class:`~.batches.StepBatches`: an iterator with ``close``, which stops prefetching).
        loop: the cadences.
        callbacks: told of steps, evaluations, saves and the end (empty on the ranks other
            than 0).
        plan: the run's resolved facts, written beside ``config.yaml`` when the loop starts.
        run: model folders, checkpoints, the resume; it holds the encoder and model selection
            (whose ``save_best`` is bound here to the current step's ``best/``).
    """

    def __init__(
        self,
        task: Task,
        optim: Optimization,
        batches: Callable[[int], Iterator[Batch]],
        loop: LoopSettings,
        callbacks: CallbackList,
        plan: RunPlan,
        run: RunState,
    ) -> None:
        self.task, self.optim, self.batches, self.loop = task, optim, batches, loop
        self.callbacks, self.plan, self.run = callbacks, plan, run
        self.encoder, self.selection, self.dist = run.encoder, run.selection, run.dist
        self.selection.save_best = lambda: run.save_model(RunFolder.BEST, self.step, True)
        self.device, self.amp_dtype = torch.device(plan.device), precision_dtype(plan.precision)
        self.step, self.totals = 0, RunTotals()  # the totals of the runs this one resumes
        self._t0: float | None = None  # when train() started its loop

    def batch_for(self, step: int) -> Batch:  # the first that batches(step) gives
        with closing(self.batches(step)) as batches:  # a prefetching thread stops
            return next(batches)

    def forward_backward(self, batch: Batch) -> LossTerms:
        """Loss terms of one batch; gradients accumulated into the parameters."""
        return forward_backward(self.task, self.optim, batch, self.loop.chunk)

    def optimizer_step(self) -> None:
        update(self.task, self.optim)  # the optimiser, then what follows the weights

    def train_step(self, batch: Batch) -> LossTerms:
        """One whole step (:func:`~.step.train_step`), as the loop takes it."""
        return train_step(self.task, self.optim, batch, self.loop.chunk)

    def _elapsed(self) -> float:
        since = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        return self.totals.wall_s + since

    def _checkpoint_due(self, logged: bool, last: bool) -> bool:
        """Whether this step writes a checkpoint: every ``save_steps`` steps, else when
        ``save_minutes`` have passed since the last one (rank 0's clock decides, at the logged
        steps only, so ranks agree without a collective at every step); always at the end."""
        loop = self.loop
        if last or loop.save_steps:
            return last or self.step % loop.save_steps == 0
        if not (loop.save_minutes and logged):
            return False
        due = time.perf_counter() - self._last_save >= loop.save_minutes * 60
        return bool(broadcast_object(due))

    def train(self) -> dict[str, Any]:
        """Run the loop to ``total_steps``; returns what ``results.json`` holds (rank 0)."""
        try:
            results = self._train()
        except BaseException:
            # however the run ends it waits for the checkpoint in flight (a kill cannot, and
            # leaves the previous file whole); the loop's error is the one raised
            try:
                self.run.writer.wait()
            except Exception as err:  # noqa: BLE001
                log.error("%s", err)
            raise
        self.run.writer.wait()
        return results

    def _train(self) -> dict[str, Any]:
        loop, main, run, folder = self.loop, self.dist.is_main, self.run, self.run.folder
        folder.path.mkdir(parents=True, exist_ok=True)
        resumed = run.resume() if loop.resume else None
        if resumed is not None:
            self.step, self.totals = resumed
        check_same_on_all_ranks(self.step, "the step to resume from (do all ranks see the checkpoint?)")  # fmt: skip
        finished = run.finished(self.step, loop.total_steps) if loop.resume else None
        if finished is not None:
            return finished  # nothing written: the first run's files stay as they were
        self._t0 = self._last_save = time.perf_counter()
        if main:
            # the plan first: it marks the folder as a cselab run's (rundir.started_here)
            self.plan.save(folder.path)
            save_config(run.config, folder.config)
        metrics = MetricsLog(folder.path, enabled=main, resume_step=self.step if resumed else None)
        progress = Progress(loop.total_steps, self.step, enabled=main)
        dev, selecting = self.selection.name, loop.eval_steps and self.selection.enabled
        if resumed is None and selecting:
            numbers = self.selection.evaluate(self.encoder, 0)
            if main:
                progress.message(f"step 0: {dev}={numbers[dev]:.2f}")
                metrics.write({"step": 0, **numbers})
                self.callbacks.on_evaluate(0, numbers)
        self.encoder.train()
        window, totals = LossWindow(), self.totals
        batches = self.batches(self.step)
        while self.step < loop.total_steps:
            batch = next(batches)
            terms = self.train_step(batch)
            self.step += 1
            window.add(self.step, terms, batch.tokens)
            last = self.step == loop.total_steps
            at_eval = bool(loop.eval_steps) and (self.step % loop.eval_steps == 0 or last)
            logged = self.step % loop.log_steps == 0
            at_save = self._checkpoint_due(logged, last)
            if not (logged or at_eval or at_save):
                continue
            n, start, tokens = len(window) * loop.batch_size, window.start, window.tokens
            means = window.flush(run.divergence_note)  # the loop's only host sync
            # timed after the sync: the device has finished the window's steps
            elapsed = time.perf_counter() - start
            totals.add(n, tokens, self.dist.world_size, elapsed)
            run.writer.check()  # a failed background write stops the run here
            row = {
                "step": self.step,
                "epoch": round(self.step / loop.steps_per_epoch, 4),
                "lr": self.optim.lr,
                "loss": sum(means.values()),
                **means,
                "sentences_per_s": n / max(elapsed, 1e-9),
            }
            if at_eval and self.selection.enabled:
                start = time.perf_counter()
                row.update(self.selection.evaluate(self.encoder, self.step))
                totals.eval_s += time.perf_counter() - start
                self.encoder.train()
            if main:
                metrics.write(row)
                trained, evaluated = split_row(row)
                self.callbacks.on_step(self.step, trained)
                if evaluated:
                    self.callbacks.on_evaluate(self.step, evaluated)
                shown = ("loss", "lr", "sentences_per_s", dev)
                progress.update(self.step, {k: row[k] for k in shown if k in row})
            if at_save:
                start = time.perf_counter()
                run.save_checkpoint(self.step, self._elapsed(), totals, True)  # collective
                totals.checkpoint_s += time.perf_counter() - start
                self._last_save = time.perf_counter()
                self.callbacks.on_save(self.step, folder.checkpoint)  # maybe still written
            barrier()
            window.start = time.perf_counter()  # evaluation and saving are not training time
        progress.close()
        batches.close()  # a prefetching thread stops here
        results = self._results() if main else {}
        self.callbacks.on_end(results)  # an empty list on the other ranks
        barrier()
        return results

    def _results(self) -> dict[str, Any]:
        run, sel = self.run, self.selection
        run.save_model(RunFolder.LAST, self.step)  # while the last checkpoint is written
        run.writer.wait()
        if sel.best_step < 0:  # no model selection: the last model is the best one known
            copy_model_folder(run.folder.last, run.folder.best)
            sel.best_step = self.step
        extra = self.callbacks.on_finish(self.step)  # before the times: they count it
        state = sel.state_dict()
        return {
            "best_step": sel.best_step,
            f"best_{sel.name}": state["best_score"],
            f"initial_{sel.name}": sel.initial_score,
            "dev": {"name": sel.name, "source": sel.source},
            "dev_history": sel.history,  # every evaluation: the score, alignment, uniformity
            "steps": self.step,
            **self.totals.results(self._elapsed()),  # the whole run's, across resumes
            **run.results(),
            "device": str(self.device),
            **self.plan.how_it_ran(),  # precision and compile mode, `auto`/`null` resolved
            # whether a decoder's rows were packed with several sentences (model.pack_rows)
            "packed_rows": self.encoder.packed_rows,
            "world_size": self.dist.world_size,
            **extra,
        }
