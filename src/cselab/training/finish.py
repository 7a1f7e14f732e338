"""What the end of a run writes besides the loop's own numbers, as callbacks the composition
root assembles (:mod:`cselab.app.train`): the selected model's Matryoshka scores, the notes on
the dev data, ``results.json`` with the final cards of ``best/`` and ``last/``, and the merged
model of a LoRA run."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from ..io.runfolder import RunFolder
from ..model.encoder import SentenceEncoder
from .callbacks import Callback, CallbackList, SavedModel
from .merge import merge_folder
from .metrics import write_results
from .runstate import RunState

log = logging.getLogger("cselab")


class MatryoshkaScores(Callback):
    """``dev_at_dims``: the selected model's dev score at each of the plan's Matryoshka
    prefixes ``dims`` (the card's table per dimension); the best model is loaded only where it
    is scored (with a dev set), before the loop's times are taken, so the wall time counts it."""

    def __init__(self, run: RunState, dims: Sequence[int], batch_size: int, fast_path: str):
        self.run, self.dims, self.batch_size, self.fast_path = (
            run,
            tuple(dims),
            batch_size,
            fast_path,
        )

    def _best_encoder(self, step: int) -> SentenceEncoder:
        """The selected model: the encoder itself when it is the best, else ``best/`` opened."""
        if self.run.selection.best_step == step:
            return self.run.encoder
        from ..model.loader import load

        best = str(self.run.folder.best)
        return load(best, device=self.run.plan.device, fast_path=self.fast_path)

    def on_finish(self, step: int) -> Mapping[str, Any] | None:
        sel = self.run.selection
        if not self.dims:
            return None
        if sel.evaluator is None or not sel.is_main:
            return {"dev_at_dims": []}
        return {
            "dev_at_dims": sel.at_dimensions(self._best_encoder(step), self.dims, self.batch_size)
        }


class EvaluationNotes(Callback):
    """``notes``: what evaluations must keep in mind of the training data (SICK-R is not
    unseen), logged once and kept in ``results.json``; evaluations repeat them."""

    def __init__(self, notes: Sequence[str]) -> None:
        self.notes = list(notes)

    def on_finish(self, step: int) -> Mapping[str, Any] | None:
        if not self.notes:
            return None
        log.info("%s", "; ".join(self.notes))
        return {"notes": self.notes}


class RunOutputs(Callback):
    """The cards of ``best/`` and ``last/`` again, now with the times (``listeners``'
    :meth:`~.callbacks.Callback.on_model_save`), then with ``merge`` a LoRA run's adapters
    folded into ``merged/``, and ``results.json`` last: its presence marks a run whose end
    was written whole, which a resume then leaves alone (:func:`~.rundir.finished_results`;
    a kill during the merge leaves a run a resume finishes). First among the callbacks, so the
    others' ``on_end`` (the Hub upload) see the final folders. ``rows``: the sentences (or
    pairs) of the training data, which ``results.json`` keeps (``train_rows``) for the cards
    written from the run folder later (``cselab merge``, ``cselab evaluate --update-card``)."""

    def __init__(
        self, run: RunState, listeners: CallbackList, merge: bool, rows: int | None = None
    ) -> None:
        self.run, self.listeners, self.merge, self.rows = run, listeners, merge, rows

    def on_finish(self, step: int) -> Mapping[str, Any] | None:
        return None if self.rows is None else {"train_rows": self.rows}

    def on_end(self, results: Mapping[str, Any]) -> None:
        folder, tell = self.run.folder, self.listeners.on_model_save
        best = int(results["best_step"])
        for name, step in ((RunFolder.BEST, best), (RunFolder.LAST, int(results["steps"]))):
            tell(SavedModel(folder.model(name), step, folder.metrics, results=results))
        if self.merge and self.run.encoder.has_adapters:
            if folder.merged.exists():  # a run killed while it merged: the merge again
                shutil.rmtree(folder.merged)
            merge_folder(
                folder.best, folder.merged,
                lambda tmp: tell(
                    SavedModel(
                        tmp, best, folder.metrics, model_id=str(folder.merged.resolve()),
                        results=results,
                    )  # the card names the folder, not its temporary name
                ),
            )  # fmt: skip
        write_results(folder.path, dict(results))


__all__ = ["EvaluationNotes", "MatryoshkaScores", "RunOutputs"]
