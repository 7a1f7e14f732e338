"""The training loop: ``losses = task(batch)``, backward, update; log, evaluate, checkpoint.

The trainer knows nothing about objectives (a :class:`~cselab.training.task.Task` turns a batch
into named loss terms) and delegates everything around the loop to a module of its own: the
optimiser (:mod:`.optim`), model selection (:mod:`.selection`), checkpoints and RNG streams
(:mod:`.checkpoint`, :mod:`.rng`) and the logs (:mod:`.metrics`). What leaves the run (the model
card of every saved folder, the Hub upload) is written by callbacks
(:meth:`~.callbacks.Callback.on_model_save`, :meth:`~.callbacks.Callback.on_end`), never here.
:func:`cselab.app.train.build_trainer` assembles a trainer from a config (the composition
root, above every layer the trainer uses): the trainer only loops.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import Config, save_config
from ..config.plan import RunPlan
from ..core.datakind import SENTENCES, DataKind
from ..data import BatchOrder, TokenizedCorpus, shard
from ..data.pairs import TokenizedPairs, evaluation_notes
from ..io.runfolder import RunFolder
from ..model.devices import is_gpu
from ..model.encoder import SentenceEncoder
from ..objectives import Objective, total_loss
from .callbacks import CallbackList, SavedModel, split_row
from .checkpoint import (
    MODEL_WRITE,
    BackgroundWriter,
    copy_model_folder,
    load_checkpoint,
    restore,
    save_model_folder,
    snapshot_checkpoint,
    snapshot_encoder,
    task_state,
    write_snapshot,
)
from .distributed import (
    DistInfo,
    all_gather_objects,
    barrier,
    broadcast_object,
    check_same_on_all_ranks,
)
from .gradcache import VERIFY_ENV, cached_forward_backward
from .merge import merge_folder
from .metrics import LossWindow, MetricsLog, Progress, write_results
from .optim import Optimization
from .rng import RNGState, dropout_seed, seed_everything
from .runtime import precision_name
from .selection import ModelSelection
from .task import Batch, Task

log = logging.getLogger("cselab")


class Trainer:
    """Runs the optimisation loop of a :class:`~cselab.config.Config` with the collaborators it
    is handed; it builds none of them (:func:`cselab.app.train.assemble_trainer` does, from the
    config and the run's :class:`~cselab.config.plan.RunPlan`).

    Args:
        config: the run configuration (saved with every checkpoint and model folder).
        encoder: the model being trained, already on ``device`` (and the same on every rank).
        task: the step's computation (:class:`~cselab.training.task.Task`: the encoder's forward,
            possibly compiled, the objective and its context).
        corpus: tokenised training sentences, or pairs
            (:class:`~cselab.data.pairs.TokenizedPairs`).
        order: the batch order over ``corpus``.
        optim: the optimiser, scheduler and loss scaling of the trainable parameters.
        selection: model selection on the dev score; its ``save_best`` is bound here to
            :meth:`save_model`.
        total_steps: how many optimiser steps the run takes.
        device: where the step runs.
        amp_dtype: the autocast dtype (``None``: fp32), ``train.precision`` as resolved.
        dist_info: this process's place in a distributed run.
        callbacks: what is told of steps, evaluations, saves and the end (empty on the ranks
            other than 0).
        kind: what ``corpus`` holds (sentences, or pairs with ``K`` hard negatives), as the data
            layer decided it when it opened the file.
        data_digest: SHA-256 of the training file, kept in checkpoints to refuse resuming on
            other data.
        matryoshka_dims: the prefixes the best model is scored at when training ends (empty:
            none).
        width_multiple: batches padded to multiples of this many tokens (the fixed shapes of a
            ``reduce-overhead`` compiled step), or ``None``.
        plan: the run's resolved facts, written beside ``config.yaml`` when the loop starts
            (:class:`~cselab.config.plan.RunPlan`); ``None``: parts built by hand, no plan.
    """

    def __init__(
        self,
        config: Config,
        encoder: SentenceEncoder,
        task: Task,
        corpus: TokenizedCorpus | TokenizedPairs,
        order: BatchOrder,
        optim: Optimization,
        selection: ModelSelection,
        *,
        total_steps: int,
        device: torch.device,
        amp_dtype: torch.dtype | None,
        dist_info: DistInfo,
        callbacks: CallbackList,
        kind: DataKind = SENTENCES,
        data_digest: str | None = None,
        matryoshka_dims: Sequence[int] = (),
        width_multiple: int | None = None,
        plan: RunPlan | None = None,
    ) -> None:
        self.config, self.corpus, self.data_digest = config, corpus, data_digest
        self.kind = kind
        self.dist = dist_info
        self.callbacks = callbacks
        self.device = device
        self.encoder = encoder
        self.out = Path(config.train.output_dir)
        self.folder = RunFolder(self.out)
        self.order = order
        self.total_steps = total_steps
        self.amp_dtype = amp_dtype
        #: fixed shapes (CUDA graphs): batches padded to multiples of this many tokens
        self.width_multiple = width_multiple
        self.task = task
        self.optim = optim
        self.selection = selection
        selection.save_best = lambda: self.save_model(RunFolder.BEST, background=True)
        self.matryoshka_dims = tuple(matryoshka_dims)
        self.plan = plan
        self.pad_id = int(encoder.tokenizer.pad_token_id or 0)
        self.step = 0
        self._order: tuple[int, Any] = (-1, None)  # (epoch, permutation) of the last batch
        self._elapsed_before = 0.0  # wall time of the runs this one resumes
        self._t0: float | None = None  # when train() started its loop
        self.writer = BackgroundWriter()  # checkpoints and best/ are written on its thread
        #: seconds the loop spent outside training steps: evaluation (with best/'s host copy),
        #: and the checkpoints' host copies (the writes themselves are the writer's)
        self.eval_seconds = self.checkpoint_seconds = 0.0

    @property
    def objective(self) -> Objective:
        return self.task.objective

    # ------------------------------------------------------------------------------ one step
    def batch_for(self, step: int) -> Batch:
        """This rank's slice of the global batch of ``step``, on the device."""
        epoch, index = divmod(step, self.order.batches_per_epoch)
        if self._order[0] != epoch:
            self._order = (epoch, self.order.epoch_order(epoch))
        rows = shard(
            self.order.batch(epoch, index, self._order[1]), self.dist.rank, self.dist.world_size
        )
        inputs = self.corpus.step_inputs(rows, self.pad_id)  # sentences or pairs alike
        # Host-side views (ESimCSE's word-repeated positive, MNTP's masked copy) are built here,
        # on the CPU tensors, before the copy: on a GPU the step then reads no device value back.
        inputs = self.task.prepare(Batch(step, inputs)).inputs
        if self.width_multiple:  # a few fixed shapes for the compiled (CUDA graph) step
            inputs = inputs.pad_to_width(self.width_multiple, self.pad_id)
        return Batch(step, inputs.to(self.device))

    def forward_backward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Loss terms of one batch; gradients accumulated into the parameters."""
        chunk = self.config.train.cache_chunk_size
        if chunk:
            verify = os.environ.get(VERIFY_ENV, "") not in ("", "0")
            return cached_forward_backward(
                self.task, batch, chunk, scale=self.optim.scale, verify=verify
            )
        terms = self.task(batch)
        self.optim.scale(total_loss(terms)).backward()
        return terms

    def optimizer_step(self) -> None:
        self.optim.step()
        self.task.after_step()  # e.g. the momentum encoder follows the new weights

    # ----------------------------------------------------------------------- what a run keeps
    def save_model(self, name: str, background: bool = False) -> Path:
        """Save the encoder as ``output_dir/name`` (an HF and sentence-transformers folder; the
        callbacks' :meth:`~.callbacks.Callback.on_model_save` add the model card).

        ``background`` (model selection's ``best/``): the step waits only for a host copy of
        the model (:func:`~.checkpoint.snapshot_encoder`); :attr:`writer`'s thread writes the
        folder, runs the callbacks on it and publishes it, after the write in flight. Whoever
        reads the folder later waits for the writer first (:meth:`_finish` does)."""
        final, sel, step = self.folder.model(name), self.selection, self.step
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

    def save_checkpoint(self, background: bool = False) -> None:
        """Collective: every rank contributes its RNG state; rank 0 copies the state to host
        memory and writes the file, in this thread or (``background``) on :attr:`writer`'s,
        after the write in flight, if any (:class:`~.checkpoint.BackgroundWriter`)."""
        # the run's device: a single process on cuda:1 keeps cuda:1's dropout stream, not the
        # current device's (cuda:0 unless someone called set_device)
        device = self.device if is_gpu(self.device) else None
        rng = all_gather_objects(RNGState.capture(device, host=True).to_record())
        if not self.dist.is_main:
            return
        o = self.optim
        extra = {
            "config": self.config.to_dict(),
            "data_digest": self.data_digest,
            "selection": self.selection.state_dict(),
            "scaler": o.scaler.state_dict() if o.scaler is not None else None,
            "elapsed": self._elapsed(),
            "precision": precision_name(self.amp_dtype),  # what `auto` resolved to
        }
        snapshot = snapshot_checkpoint(
            self.encoder, o.optimizer, o.scheduler, self.step, extra, rng, self.task.state_dict()
        )
        if background:
            self.writer.submit(self.folder.checkpoint, snapshot)
        else:
            self.writer.wait()  # never two writers of one file
            write_snapshot(self.folder.checkpoint, snapshot)

    def resume(self) -> bool:
        """Continue from ``output_dir/checkpoint`` if it exists."""
        path = self.folder.checkpoint_file
        if not path.is_file():
            return False
        tensors, meta = load_checkpoint(path)  # its config was checked before the run started
        extra, o = meta["extra"], self.optim
        device = self.device if is_gpu(self.device) else None
        if not restore(
            tensors, meta, self.encoder, o.optimizer, o.scheduler, self.dist.rank, device
        ):
            # Written by a run with fewer ranks: this rank has no stream to continue, so it
            # starts a fresh one that depends on (seed, rank, step) only.
            seed_everything(
                dropout_seed(self.config.train.seed + int(meta["step"]), self.dist.rank)
            )
            log.warning(
                "%s holds no RNG state for rank %d (saved with fewer ranks): its dropout stream "
                "is re-seeded, so this resumed run is not bit-identical to an uninterrupted one",
                path, self.dist.rank,
            )  # fmt: skip
        self.task.load_state_dict(task_state(tensors))  # every rank: the same global queue
        self.step = int(meta["step"])
        self.selection.load_state_dict(extra["selection"])
        self._elapsed_before = float(extra["elapsed"])
        if o.scaler is not None and extra["scaler"]:
            o.scaler.load_state_dict(extra["scaler"])
        log.info("resumed from %s at step %d", path, self.step)
        self._check_resumed_precision(path, extra.get("precision"))
        return True

    def _check_resumed_precision(self, path: Path, saved: str | None) -> None:
        """Warn, in one line, when the checkpoint trained in another precision than this run
        (``train.precision: auto`` resolved on another device: bf16 on an Ampere GPU, fp32 on
        an older one or the CPU). Not refused: the weights and AdamW's moments are fp32 either
        way, and on a device without bf16 no setting could resume the run (a changed
        ``train.precision`` is refused as a run-changing key); but its next steps are not those
        the first device would have taken."""
        now = self.plan.precision if self.plan is not None else precision_name(self.amp_dtype)
        if saved is None or saved == now or not self.dist.is_main:
            return
        log.warning(
            "%s was trained in %s; this run resumes it in %s (train.precision=%s on %s), so "
            "its steps differ from those of the device that trained it",
            path, saved, now, self.config.train.precision, self.device,
        )  # fmt: skip

    def _elapsed(self) -> float:
        since = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        return self._elapsed_before + since

    def _divergence_note(self) -> str:
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

    # ------------------------------------------------------------------------------- the loop
    def _checkpoint_due(self, logged: bool, last: bool) -> bool:
        """Whether this step writes a checkpoint: every ``train.save_steps`` steps, else when
        ``train.save_minutes`` have passed since the last one (rank 0's clock decides, at the
        logged steps only, so ranks agree without a collective at every step); always at the
        end."""
        tc = self.config.train
        if last:
            return True
        if tc.save_steps:
            return self.step % tc.save_steps == 0
        if not (tc.save_minutes and logged):
            return False
        due = time.perf_counter() - self._last_save >= tc.save_minutes * 60
        return bool(broadcast_object(due))

    def train(self) -> dict[str, Any]:
        """Run the loop to ``total_steps``; returns what ``results.json`` holds (rank 0)."""
        try:
            results = self._train()
        except BaseException:
            # however the run ends it waits for the checkpoint in flight (a kill cannot, and
            # leaves the previous file whole); the loop's error is the one raised
            try:
                self.writer.wait()
            except Exception as err:  # noqa: BLE001
                log.error("%s", err)
            raise
        self.writer.wait()
        return results

    def _train(self) -> dict[str, Any]:
        tc, main = self.config.train, self.dist.is_main
        self.out.mkdir(parents=True, exist_ok=True)
        resumed = tc.resume and self.resume()
        check_same_on_all_ranks(self.step, "the step to resume from (do all ranks see the checkpoint?)")  # fmt: skip
        self._t0 = self._last_save = time.perf_counter()
        if main:
            save_config(self.config, self.folder.config)
            if self.plan is not None:
                self.plan.save(self.out)
        metrics = MetricsLog(self.out, enabled=main, resume_step=self.step if resumed else None)
        progress = Progress(self.total_steps, self.step, enabled=main)
        eval_every = tc.eval_steps
        dev = self.selection.name
        if not resumed and eval_every and self.selection.enabled:
            numbers = self.selection.evaluate(self.encoder, 0)
            if main:
                progress.message(f"step 0: {dev}={numbers[dev]:.2f}")
                metrics.write({"step": 0, **numbers})
                self.callbacks.on_evaluate(0, numbers)
        self.encoder.train()
        window, sentences, train_time = LossWindow(), 0, 0.0
        while self.step < self.total_steps:
            terms = self.forward_backward(self.batch_for(self.step))
            self.optimizer_step()
            self.step += 1
            window.add(self.step, terms)
            last = self.step == self.total_steps
            at_eval = bool(eval_every) and (self.step % eval_every == 0 or last)
            logged = self.step % tc.log_steps == 0
            at_save = self._checkpoint_due(logged, last)
            if not (logged or at_eval or at_save):
                continue
            n, start = len(window) * tc.batch_size, window.start
            means = window.flush(self._divergence_note)  # the loop's only host sync
            # timed after the sync: the device has finished the window's steps
            elapsed = time.perf_counter() - start
            sentences, train_time = sentences + n, train_time + elapsed
            self.writer.check()  # a failed background write stops the run here
            row = {
                "step": self.step,
                "epoch": round(self.step / self.order.batches_per_epoch, 4),
                "lr": self.optim.lr,
                "loss": sum(means.values()),
                **means,
                "sentences_per_s": n / max(elapsed, 1e-9),
            }
            if at_eval and self.selection.enabled:
                start = time.perf_counter()
                row.update(self.selection.evaluate(self.encoder, self.step))
                self.eval_seconds += time.perf_counter() - start
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
                self.save_checkpoint(background=True)  # collective: all ranks send RNG states
                self.checkpoint_seconds += time.perf_counter() - start
                self._last_save = time.perf_counter()
                # main rank only; the file may still be being written (see BackgroundWriter)
                self.callbacks.on_save(self.step, self.folder.checkpoint)
            barrier()
            window.start = time.perf_counter()  # evaluation and saving are not training time
        progress.close()
        results = self._finish(sentences, train_time) if main else {}
        self.callbacks.on_end(results)  # an empty list on the other ranks
        barrier()
        return results

    def _best_encoder(self) -> SentenceEncoder:
        """The selected model: the encoder itself when it is the best, else ``best/`` opened."""
        if self.selection.best_step == self.step:
            return self.encoder
        from ..model.loader import load

        return load(
            str(self.folder.best), device=self.device, fast_path=self.config.model.fast_path
        )

    def _finish(self, sentences: int, train_time: float) -> dict[str, Any]:
        self.save_model(RunFolder.LAST)  # while the last checkpoint is written
        self.writer.wait()
        sel = self.selection
        if sel.best_step < 0:  # no model selection: the last model is the best one known
            copy_model_folder(self.folder.last, self.folder.best)
            sel.best_step = self.step
        state = sel.state_dict()
        at_dims: list[dict[str, float]] | None = None
        if dims := self.matryoshka_dims:  # the card's table per dimension (the run's plan)
            # the best model is loaded only where it is scored (rank 0, with a dev set); before
            # the times are taken, so the wall time counts it
            scored = sel.evaluator is not None and sel.is_main
            at_dims = (
                sel.at_dimensions(self._best_encoder(), dims, self.config.eval.batch_size)
                if scored
                else []
            )
        results = {
            "best_step": sel.best_step,
            f"best_{sel.name}": state["best_score"],
            f"initial_{sel.name}": sel.initial_score,
            "dev": {"name": sel.name, "source": sel.source},
            "dev_history": sel.history,  # every evaluation: the score, alignment, uniformity
            "steps": self.step,
            "wall_time_s": round(self._elapsed(), 2),
            "train_time_s": round(train_time, 2),
            "sentences_per_s": round(sentences / train_time, 2) if train_time else None,
            # outside train_time: evaluations (with best/'s host copies) and the checkpoints'
            # host copies; the *_write_s ran on the writer's thread, beside training
            "eval_time_s": round(self.eval_seconds, 2),
            "checkpoint_time_s": round(self.checkpoint_seconds, 2),
            "checkpoint_write_s": round(self.writer.write_seconds, 2),
            "best_write_s": round(self.writer.seconds.get(MODEL_WRITE, 0.0), 2),
            "device": str(self.device),
            "precision": precision_name(self.amp_dtype),  # what ran: `auto` resolved
            "world_size": self.dist.world_size,
        }
        if at_dims is not None:
            results["dev_at_dims"] = at_dims
        if notes := evaluation_notes(self.config.data):  # e.g. SICK-R is not unseen
            results["notes"] = notes
            log.info("%s", "; ".join(notes))  # kept in results.json; evaluations repeat it
        write_results(self.out, results)
        for name, step in ((RunFolder.BEST, sel.best_step), (RunFolder.LAST, self.step)):
            self.callbacks.on_model_save(  # now with the times
                SavedModel(self.folder.model(name), step, self.folder.metrics, results=results)
            )
        if self.config.train.save_merged and self.encoder.has_adapters:
            merged = self.folder.merged
            if merged.exists():  # a resumed run that had finished once: the new best replaces it
                shutil.rmtree(merged)
            merge_folder(
                self.folder.best, merged, lambda tmp: self.callbacks.on_model_save(
                    SavedModel(tmp, sel.best_step, self.folder.metrics, results=results)
                ),
            )  # fmt: skip
        return results
