"""What a run keeps on disk while it loops: model folders, checkpoints, and a resume from one.

:class:`RunState` holds the collaborators whose state a checkpoint carries (the encoder, the
optimiser, the task's state, model selection, each rank's generators) and the background
writer of checkpoints and ``best/`` (:class:`~.checkpoint.BackgroundWriter`). The trainer asks
it to save at the steps its cadences choose and to resume once before its loop; the device and
the precision it compares a checkpoint with are the run plan's
(:class:`~cselab.config.plan.RunPlan`), never derived again.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..config.plan import RunPlan
from ..core.errors import UserError
from ..io.runfolder import RunFolder
from ..model.devices import is_gpu
from ..model.encoder import SentenceEncoder
from .callbacks import CallbackList, SavedModel
from .checkpoint import (
    MODEL_WRITE,
    BackgroundWriter,
    load_checkpoint,
    restore,
    save_model_folder,
    snapshot_checkpoint,
    snapshot_encoder,
    task_state,
    write_snapshot,
)
from .distributed import DistInfo, all_gather_objects, broadcast_object
from .optim import Optimization
from .rng import RNGState, dropout_seed, seed_everything
from .rundir import finished_results, say_finished
from .selection import ModelSelection
from .task import Task

log = logging.getLogger("cselab")


@dataclass
class RunTotals:
    """A run's running totals, carried across resumes in every checkpoint so that
    ``results.json``'s times are the whole run's (the steps a kill made redo count once).

    Attributes:
        wall_s: wall seconds of the runs this process resumes.
        train_s, sentences: the training steps' seconds (timed after the device sync) and
            sentences.
        tokens, padded_tokens, counted_s: the real tokens of those steps' sentence columns,
            the positions their padded batches held (rank 0's counts times the number of
            ranks) and the training seconds they were counted in (a checkpoint written before
            tokens were counted carries none).
        eval_s, checkpoint_s: seconds outside the training steps: evaluations (with
            ``best/``'s host copies), the checkpoints' host copies (a checkpoint's own copy is
            timed once it is written, so the next checkpoint carries it).

    A checkpoint written before the totals were kept gives its wall time only: the resumed
    run's training time and rate then count its own steps.
    """

    wall_s: float = 0.0
    train_s: float = 0.0
    sentences: int = 0
    eval_s: float = 0.0
    checkpoint_s: float = 0.0
    tokens: int = 0
    padded_tokens: int = 0
    counted_s: float = 0.0

    def add(self, sentences: int, tokens: tuple[int, int], ranks: int, seconds: float) -> None:
        """Count a window of training steps: ``sentences`` (the global batches'), this rank's
        ``(real, padded)`` tokens (scaled by ``ranks``: each rank takes an equal slice of the
        rows) and their ``seconds``."""
        self.sentences, self.train_s = self.sentences + sentences, self.train_s + seconds
        if tokens[1]:
            self.tokens += tokens[0] * ranks
            self.padded_tokens += tokens[1] * ranks
            self.counted_s += seconds

    def record(self, wall_s: float) -> dict[str, Any]:
        """The checkpoint's entries at wall time ``wall_s`` (``elapsed`` as before)."""
        times = {k: v for k, v in dataclasses.asdict(self).items() if k != "wall_s"}
        return {"elapsed": wall_s, "times": times}

    def results(self, wall_s: float) -> dict[str, Any]:
        """``results.json``'s times at wall time ``wall_s``: the wall time, and within it the
        training steps' time and rate (sentences, and real tokens of the sentence columns, each
        counted once however many views encode it), the share of the padded batches' positions
        that held padding, the evaluations' and the checkpoints' host copies."""
        rate = round(self.sentences / self.train_s, 2) if self.train_s else None
        tokens = round(self.tokens / self.counted_s, 1) if self.counted_s else None
        padding = 1 - self.tokens / self.padded_tokens if self.padded_tokens else None
        return {
            "wall_time_s": round(wall_s, 2),
            "train_time_s": round(self.train_s, 2),
            "sentences_per_s": rate,
            "tokens_per_s": tokens,
            "padding": None if padding is None else round(padding, 4),
            "eval_time_s": round(self.eval_s, 2),
            "checkpoint_time_s": round(self.checkpoint_s, 2),
        }

    @classmethod
    def from_record(cls, extra: dict[str, Any]) -> RunTotals:
        """The totals a checkpoint's ``extra`` holds (only the wall time from a checkpoint
        written before the others were kept)."""
        times = extra.get("times") or {}
        kept = {  # each total as its field's type; one a checkpoint lacks at its default
            f.name: type(f.default)(times.get(f.name, f.default))
            for f in dataclasses.fields(cls)
            if f.name != "wall_s"
        }
        return cls(wall_s=float(extra["elapsed"]), **kept)


class RunState:
    """Saves and restores one run (see the module doc).

    Args:
        config: the run's config as written into ``config.yaml``, every checkpoint and every
            model folder (``cselab_config.yaml``); only saved, never read for a resolved fact.
        plan: the run's resolved facts (its device and precision).
        encoder, task, optim, selection: the collaborators whose state a checkpoint carries.
        dist: this process's place in a distributed run.
        callbacks: told of every model folder written (:meth:`Callback.on_model_save`).
        data_digest: SHA-256 of the training file, kept in checkpoints to refuse resuming on
            other data.
    """

    def __init__(
        self,
        config: Config,
        plan: RunPlan,
        encoder: SentenceEncoder,
        task: Task,
        optim: Optimization,
        selection: ModelSelection,
        dist: DistInfo,
        callbacks: CallbackList,
        data_digest: str | None = None,
    ) -> None:
        self.config, self.plan, self.encoder, self.task = config, plan, encoder, task
        self.optim, self.selection, self.dist, self.callbacks = optim, selection, dist, callbacks
        self.data_digest = data_digest
        self.seed = config.train.seed
        self.folder = RunFolder(config.train.output_dir)
        device = torch.device(plan.device)
        # the run's GPU: a single process on cuda:1 keeps cuda:1's dropout stream, not the
        # current device's (cuda:0 unless someone called set_device)
        self.rng_device = device if is_gpu(device) else None
        self.writer = BackgroundWriter()  # checkpoints and best/ are written on its thread

    def save_model(self, name: str, step: int, background: bool = False) -> Path:
        """Save the encoder as ``output_dir/name`` (an HF and sentence-transformers folder; the
        callbacks' :meth:`~.callbacks.Callback.on_model_save` add the model card).

        ``background`` (model selection's ``best/``): the step waits only for a host copy of
        the model (:func:`~.checkpoint.snapshot_encoder`); :attr:`writer`'s thread writes the
        folder, runs the callbacks on it and publishes it, after the write in flight. Whoever
        reads the folder later waits for the writer first (the end of the loop does)."""
        final, sel = self.folder.model(name), self.selection
        score = sel.best_score if name == RunFolder.BEST and sel.best_step == step else None
        # a background card reads metrics.csv while the loop appends to it: only earlier rows
        rows = {"rows_before": step} if background else {}

        def describe(folder: Path) -> None:
            self.callbacks.on_model_save(
                SavedModel(folder, step, self.folder.metrics, score, str(final.resolve()), **rows)
            )

        if not background:
            return save_model_folder(self.encoder, self.config, final, describe)
        snapshot = snapshot_encoder(self.encoder)
        self.writer.run(
            lambda: save_model_folder(snapshot, self.config, final, describe), MODEL_WRITE
        )
        return final

    def save_checkpoint(
        self, step: int, elapsed: float, totals: RunTotals | None = None, background: bool = False
    ) -> None:
        """Collective: every rank contributes its RNG state; rank 0 copies the state to host
        memory and writes the file, in this thread or (``background``) on :attr:`writer`'s,
        after the write in flight, if any (:class:`~.checkpoint.BackgroundWriter`).
        ``elapsed``: the run's wall time so far; ``totals``: its other running totals, which a
        resume carries on (:meth:`resume`)."""
        rng = all_gather_objects(RNGState.capture(self.rng_device, host=True).to_record())
        if not self.dist.is_main:
            return
        o = self.optim
        extra = {
            "config": self.config.to_dict(),
            "data_digest": self.data_digest,
            "selection": self.selection.state_dict(),
            "scaler": o.scaler.state_dict() if o.scaler is not None else None,
            **(totals or RunTotals()).record(elapsed),
            "precision": self.plan.precision,  # what `auto` resolved to
        }
        snapshot = snapshot_checkpoint(
            self.encoder, o.optimizer, o.scheduler, step, extra, rng, self.task.state_dict()
        )
        if background:
            self.writer.submit(self.folder.checkpoint, snapshot)
        else:
            self.writer.wait()  # never two writers of one file
            write_snapshot(self.folder.checkpoint, snapshot)

    def resume(self) -> tuple[int, RunTotals] | None:
        """Continue from ``output_dir/checkpoint`` if it exists: ``(step, the running totals
        saved with it)``, or ``None`` without a checkpoint."""
        path = self.folder.checkpoint_file
        if not path.is_file():
            return None
        tensors, meta = load_checkpoint(path)  # its config was checked before the run started
        extra, o, rank = meta["extra"], self.optim, self.dist.rank
        step = int(meta["step"])
        if not restore(
            tensors, meta, self.encoder, o.optimizer, o.scheduler, rank, self.rng_device
        ):
            # Written by a run with fewer ranks: this rank has no stream to continue, so it
            # starts a fresh one that depends on (seed, rank, step) only.
            seed_everything(dropout_seed(self.seed + step, rank))
            log.warning(
                "%s holds no RNG state for rank %d (saved with fewer ranks): its dropout stream "
                "is re-seeded, so this resumed run is not bit-identical to an uninterrupted one",
                path, rank,
            )  # fmt: skip
        self.task.load_state_dict(task_state(tensors))  # every rank: the same global queue
        self.selection.load_state_dict(extra["selection"])
        if self.selection.best_step >= 0 and not self.folder.best.is_dir():
            # removed since (by hand, or a disk that lost it): its card could not be written
            # at the end; selection starts over, and without a later score the last model is
            # kept as best/, as in a run without selection
            log.warning(
                "%s is missing (the best model of step %d): model selection starts over from "
                "step %d", self.folder.best, self.selection.best_step, step,
            )  # fmt: skip
            self.selection.load_state_dict({**extra["selection"], "best_score": None,
                                            "best_step": -1})  # fmt: skip
        if o.scaler is not None and extra["scaler"]:
            o.scaler.load_state_dict(extra["scaler"])
        log.info("resumed from %s at step %d", path, step)
        self.check_resumed_precision(path, extra.get("precision"))
        return step, RunTotals.from_record(extra)

    def finished(self, step: int, total_steps: int) -> dict[str, Any] | None:
        """Collective: the results of the run in this folder if a resume at ``step`` finds it
        finished (:func:`~.rundir.finished_results`: its checkpoint at the last step and its
        ``results.json`` written; rank 0 reads them, ``{}`` on the other ranks), logged in
        one line (:func:`~.rundir.say_finished`); else ``None``. A finished run's resume writes
        nothing. An unreadable ``results.json`` stops every rank with one line saying how to
        write the end again. (:func:`cselab.app.train.train` asks the folder the same before
        the model is loaded; this is the check of a trainer built by hand.)
        """
        found, error = None, None
        if self.dist.is_main:
            try:
                found = finished_results(self.folder.path, step, total_steps)
            except UserError as err:
                error = str(err)
        done, error = broadcast_object((found is not None, error))
        if error:
            raise UserError(error)  # on every rank: none waits in a collective for rank 0
        if not done:
            return None
        if self.dist.is_main:
            tc = self.config.train
            say_finished(self.folder.path, step, tc.push_to_hub, tc.save_merged)
        return found or {}

    def check_resumed_precision(self, path: Path, saved: str | None) -> None:
        """Warn, in one line, when the checkpoint trained in another precision than this run
        (``train.precision: auto`` resolved on another device: bf16 on an Ampere GPU, fp32 on
        an older one or the CPU). Not refused: the weights and AdamW's moments are fp32 either
        way, and on a device without bf16 no setting could resume the run (a changed
        ``train.precision`` is refused as a run-changing key); but its next steps are not those
        the first device would have taken."""
        now = self.plan.precision
        if saved is None or saved == now or not self.dist.is_main:
            return
        log.warning(
            "%s was trained in %s; this run resumes it in %s (train.precision as resolved on "
            "%s), so its steps differ from those of the device that trained it",
            path, saved, now, self.plan.device,
        )  # fmt: skip

    def divergence_note(self) -> str:
        """Where the last good checkpoint is, for the message of a diverged loss."""
        try:
            self.writer.wait()  # a checkpoint in flight is the last good one once written
        except Exception as err:  # noqa: BLE001 - the divergence is the error to raise
            log.error("%s", err)
        ckpt = self.folder.checkpoint_file
        if not ckpt.is_file():
            return "no checkpoint had been written yet"
        return (
            f"the last good checkpoint is kept in {ckpt.parent} (resume with "
            "--train.resume=true after changing what diverged)"
        )

    def results(self) -> dict[str, Any]:
        """What the writes cost, for ``results.json`` (the writer waited for; this process's,
        not carried across resumes)."""
        return {
            "checkpoint_write_s": round(self.writer.write_seconds, 2),
            "best_write_s": round(self.writer.seconds.get(MODEL_WRITE, 0.0), 2),
        }


__all__ = ["RunState", "RunTotals"]
