"""A thin trainer: views → objective → named loss terms → AdamW step.

The trainer knows nothing about specific objectives: it asks the objective which views it
needs, computes them (:mod:`cselab.views`), sums the returned terms and logs each one.
Model selection follows SimCSE (``load_best_model_at_end``): STS-B dev Spearman every
``eval_steps``; the best model and the last model are both saved.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import (
    CHECKPOINT_FILE,
    load_checkpoint,
    publishing,
    restore,
    rng_state,
    save_checkpoint,
)
from .config import Config, ConfigError, load_config, save_config
from .data import BatchOrder, TokenizedCorpus, collate, shard, tokenize_corpus
from .distributed import (
    DistInfo,
    all_gather_objects,
    average_gradients,
    average_over_ranks,
    barrier,
    broadcast_module,
    check_same_on_all_ranks,
    dropout_seed,
    gather_with_grad,
    init_distributed,
    main_process_first,
    objective_seed,
    shutdown_distributed,
)
from .encoder import SentenceEncoder
from .hub import cache_root, resolve_train_file
from .metrics import MetricsLog, Progress
from .objectives import Objective, ObjectiveContext, build_objective, total_loss
from .views import compute_views

log = logging.getLogger("cselab")

Evaluator = Callable[[SentenceEncoder], float]


class TrainingDiverged(RuntimeError):
    """A loss term became NaN or infinite."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def pick_device(name: str, dist_info: DistInfo) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", dist_info.local_rank)
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name}, but no CUDA GPU is available; use cpu or auto")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device`` (``None``: full fp32)."""
    if precision == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return None
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(
            f"train.precision=fp16 needs a CUDA GPU, not {device.type}; use bf16 or fp32"
        )
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning(
            "train.precision=bf16 on a CPU without native bf16 matrix products (no AVX512-BF16/AMX): "
            "PyTorch falls back to slow bf16 kernels and training is several times slower than "
            "fp32; prefer train.precision=fp32 on this machine"
        )
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN has native bf16 matrix products on this CPU (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup  # the first update is taken at a non-zero lr
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _replace_dir(tmp: Path, final: Path) -> None:
    """Publish folder ``tmp`` as ``final`` so that one complete copy always exists."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


class Trainer:
    """Runs the optimisation loop of :class:`~cselab.config.Config` on an encoder and objective.

    Args:
        config: the run configuration (saved with every checkpoint).
        encoder: the model being trained.
        objective: any :class:`~cselab.objectives.Objective`.
        corpus: tokenised training sentences.
        evaluator: ``encoder -> dev score`` (higher is better) for model selection, or ``None``.
        dist_info: this process's place in a distributed run.
        step_fn: optional replacement for the forward/backward of one batch (e.g. GradCache):
            ``(trainer, batch) -> loss terms`` with gradients already accumulated.
    """

    def __init__(
        self,
        config: Config,
        encoder: SentenceEncoder,
        objective: Objective,
        corpus: TokenizedCorpus,
        evaluator: Evaluator | None = None,
        dist_info: DistInfo | None = None,
        step_fn: Callable[[Trainer, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
        | None = None,
    ) -> None:
        self.config = config
        self.dist = dist_info or DistInfo()
        tc = config.train
        self.device = pick_device(tc.device, self.dist)
        self.encoder = encoder.to(self.device)
        broadcast_module(self.encoder)  # every rank starts from rank 0's weights (as DDP does)
        self.objective = objective.to(self.device)
        self.corpus = corpus
        self.evaluator = evaluator
        self.step_fn = step_fn
        self.out = Path(tc.output_dir)
        if tc.batch_size % self.dist.world_size:
            raise ValueError(
                f"train.batch_size={tc.batch_size} must be divisible by the {self.dist.world_size} ranks"
            )
        self.order = BatchOrder(len(corpus), tc.batch_size, tc.seed)
        per_epoch = self.order.batches_per_epoch
        self.total_steps = tc.max_steps or per_epoch * tc.epochs
        self.amp_dtype = autocast_dtype(tc.precision, self.device)
        self.scaler = (
            torch.amp.GradScaler(self.device.type) if self.amp_dtype == torch.float16 else None
        )
        self.params = [p for p in self.encoder.parameters() if p.requires_grad]
        fused = tc.fused_adamw and self.device.type in ("cuda", "cpu")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=tc.lr, weight_decay=tc.weight_decay, fused=fused or None
        )
        warmup = tc.warmup_steps or int(tc.warmup_ratio * self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_schedule(warmup, self.total_steps)
        )
        self.pad_id = int(encoder.tokenizer.pad_token_id or 0)
        self.ctx = ObjectiveContext(
            gather=gather_with_grad,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            offset=self.dist.rank * (tc.batch_size // self.dist.world_size),
            # Re-seeded from (seed, step) before every step: generated negatives are the same on
            # every rank and in a resumed run (see distributed.objective_seed).
            generator=torch.Generator(device=self.device),
        )
        self.model_forward = torch.compile(self.encoder) if tc.compile else self.encoder
        self.step = 0
        self.best_score = -math.inf
        self.best_step = -1
        self.history: list[dict[str, float]] = []

    # ------------------------------------------------------------------------------ one batch
    def batch_for(self, step: int) -> dict[str, torch.Tensor]:
        per_epoch = self.order.batches_per_epoch
        epoch, index = divmod(step, per_epoch)
        if index == 0 or not hasattr(self, "_order_epoch") or self._order_epoch != epoch:
            self._order_cache = self.order.epoch_order(epoch)
            self._order_epoch = epoch
        rows = shard(
            self.order.batch(epoch, index, self._order_cache), self.dist.rank, self.dist.world_size
        )
        batch = collate(self.corpus.rows(rows), self.pad_id)
        pin = self.device.type == "cuda"
        return {
            k: (v.pin_memory() if pin else v).to(self.device, non_blocking=pin)
            for k, v in batch.items()
        }

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def forward_backward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Loss terms of one batch; gradients accumulated into the parameters."""
        self.ctx.generator.manual_seed(objective_seed(self.config.train.seed, self.step))
        if self.step_fn is not None:
            return self.step_fn(self, batch)
        with self.autocast():
            views = compute_views(self.model_forward, batch, self.objective.required_views)
        terms = self.objective(views, self.ctx)
        loss = total_loss(terms)
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        return terms

    def optimizer_step(self) -> None:
        average_gradients(self.params)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.config.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.train.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    # --------------------------------------------------------------------------- bookkeeping
    def _check_finite(self, window: list[tuple[int, dict[str, torch.Tensor]]]) -> None:
        """Raise :class:`TrainingDiverged` naming the first non-finite step and term."""
        if not window:
            return
        names = list(window[0][1])
        values = torch.stack(
            [torch.stack([t[n].detach().float() for n in names]) for _, t in window]
        )
        # Under DDP each rank's per-anchor terms cover its own anchors: the mean over ranks is the
        # global-batch loss (batch-level terms are equal on every rank), and every rank sees a
        # non-finite value if any rank does, so all ranks stop together.
        values = average_over_ranks(values).cpu()
        bad = ~torch.isfinite(values)
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            step = window[row][0]
            ckpt = self.out / "checkpoint" / CHECKPOINT_FILE
            kept = (
                f"the last good checkpoint is kept in {ckpt.parent} (resume with "
                "--train.resume=true after changing what diverged)"
                if ckpt.is_file()
                else "no checkpoint had been written yet"
            )
            raise TrainingDiverged(
                f"loss term '{names[col]}' is {values[row, col].item()} at step {step}; {kept}"
            )
        self._window_means = dict(zip(names, values.mean(0).tolist(), strict=True))

    def save_model(self, name: str) -> Path:
        """Save the encoder as ``output_dir/name`` (HF + sentence-transformers folder)."""
        final = self.out / name
        tmp = self.out / f"{name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        with publishing(final, "model folder", tmp):
            self.encoder.save(tmp)
            save_config(self.config, tmp / "cselab_config.yaml")
            _replace_dir(tmp, final)
        return final

    def save_checkpoint(self) -> None:
        """Collective: every rank contributes its RNG states; rank 0 writes the file."""
        rng = all_gather_objects(rng_state())
        if not self.dist.is_main:
            return
        save_checkpoint(
            self.out / "checkpoint",
            self.encoder,
            self.optimizer,
            self.scheduler,
            self.step,
            extra={
                "config": self.config.to_dict(),
                "best_score": self.best_score if math.isfinite(self.best_score) else None,
                "best_step": self.best_step,
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "elapsed": self._elapsed(),
            },
            rng=rng,
        )

    def _elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._t0

    def try_resume(self) -> bool:
        path = self.out / "checkpoint" / CHECKPOINT_FILE
        if not path.is_file():
            return False
        tensors, meta = load_checkpoint(path)
        if not restore(tensors, meta, self.encoder, self.optimizer, self.scheduler, self.dist.rank):
            # The checkpoint was written by a run with fewer ranks: this rank has no stream to
            # continue, so it starts a fresh one that depends on (seed, rank, step) only.
            seed_everything(
                dropout_seed(self.config.train.seed + int(meta["step"]), self.dist.rank)
            )
            log.warning(
                "%s holds no RNG state for rank %d (saved with fewer ranks): its dropout stream "
                "is re-seeded, so this resumed run is not bit-identical to an uninterrupted one",
                path, self.dist.rank,
            )  # fmt: skip
        extra = meta["extra"]
        if extra["config"]["train"]["batch_size"] != self.config.train.batch_size:
            raise ValueError(f"{path}: checkpoint was trained with a different train.batch_size")
        self.step = int(meta["step"])
        self.best_score = extra["best_score"] if extra["best_score"] is not None else -math.inf
        self.best_step = int(extra["best_step"])
        self._elapsed_before = float(extra.get("elapsed", 0.0))
        if self.scaler is not None and extra.get("scaler"):
            self.scaler.load_state_dict(extra["scaler"])
        log.info("resumed from %s at step %d", path, self.step)
        return True

    def evaluate(self) -> float | None:
        if self.evaluator is None:
            return None
        score = float(self.evaluator(self.encoder)) if self.dist.is_main else None
        if self.dist.is_main and score > self.best_score:
            self.best_score, self.best_step = score, self.step
            self.save_model("best")
        barrier()
        return score

    # ------------------------------------------------------------------------------- the loop
    def train(self) -> dict[str, Any]:
        tc = self.config.train
        main = self.dist.is_main
        self._t0 = time.perf_counter()
        self._elapsed_before = 0.0
        self.out.mkdir(parents=True, exist_ok=True)
        resumed = tc.resume and self.try_resume()
        check_same_on_all_ranks(
            self.step, "the step to resume from (do all ranks see the checkpoint?)"
        )
        self._t0 = time.perf_counter()
        if main:
            save_config(self.config, self.out / "config.yaml")
        metrics = MetricsLog(self.out, enabled=main, resume_step=self.step if resumed else None)
        progress = Progress(self.total_steps, self.step, enabled=main)
        eval_every = tc.eval_steps
        save_every = tc.save_steps or eval_every
        if not resumed and eval_every and self.evaluator is not None:
            score = self.evaluate()
            if main:
                progress.message(f"step 0: stsb_dev={score:.2f}")
                metrics.write({"step": 0, "stsb_dev": score})
            self.initial_score = score
        self.encoder.train()
        window: list[tuple[int, dict[str, torch.Tensor]]] = []
        window_start = time.perf_counter()
        window_sentences = 0
        sentences_total, train_time = 0, 0.0
        while self.step < self.total_steps:
            batch = self.batch_for(self.step)
            terms = self.forward_backward(batch)
            self.optimizer_step()
            self.step += 1
            window.append((self.step, {k: v.detach() for k, v in terms.items()}))
            window_sentences += tc.batch_size
            at_eval = bool(eval_every) and (
                self.step % eval_every == 0 or self.step == self.total_steps
            )
            at_save = (
                bool(save_every) and self.step % save_every == 0
            ) or self.step == self.total_steps
            if self.step % tc.log_steps == 0 or at_eval or at_save:
                self._check_finite(window)  # the only host sync of the loop
                elapsed = time.perf_counter() - window_start
                sentences_total += window_sentences
                train_time += elapsed
                row = {
                    "step": self.step,
                    "epoch": round(self.step / self.order.batches_per_epoch, 4),
                    "lr": self.scheduler.get_last_lr()[0],
                    "loss": sum(self._window_means.values()),
                    **self._window_means,
                    "sentences_per_s": window_sentences / max(elapsed, 1e-9),
                }
                window, window_sentences = [], 0
                if at_eval and self.evaluator is not None:
                    row["stsb_dev"] = self.evaluate()
                    self.encoder.train()
                if main:
                    metrics.write(row)
                    progress.update(self.step, {k: row[k] for k in ("loss", "lr", "sentences_per_s") if k in row}
                                    | ({"stsb_dev": row["stsb_dev"]} if "stsb_dev" in row else {}))  # fmt: skip
                if at_save:
                    self.save_checkpoint()  # collective: all ranks send RNG states
                barrier()
                window_start = time.perf_counter()
        progress.close()
        metrics.close()
        results = self._finish(sentences_total, train_time)
        barrier()
        return results

    def _finish(self, sentences: int, train_time: float) -> dict[str, Any]:
        if not self.dist.is_main:
            return {}
        self.save_model("last")
        if self.best_step < 0:  # no model selection: the last model is the best we know
            shutil.copytree(self.out / "last", self.out / "best", dirs_exist_ok=True)
            self.best_step = self.step
        results = {
            "best_step": self.best_step,
            "best_stsb_dev": self.best_score if math.isfinite(self.best_score) else None,
            "initial_stsb_dev": getattr(self, "initial_score", None),
            "steps": self.step,
            "wall_time_s": round(self._elapsed(), 2),
            "train_time_s": round(train_time, 2),
            "sentences_per_s": round(sentences / train_time, 2) if train_time else None,
            "device": str(self.device),
            "precision": self.config.train.precision,
            "world_size": self.dist.world_size,
        }
        (self.out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        return results


def make_dev_evaluator(config: Config) -> Evaluator | None:
    """STS-B dev Spearman ×100 (cosine, no training) for model selection, or ``None``."""
    if not (config.eval.enabled and config.train.eval_steps):
        return None
    from .evaluation.datasets import resolve_data_dir
    from .evaluation.sts import stsb_dev_spearman

    data_dir = resolve_data_dir(config.eval.data_dir)
    batch_size = config.eval.batch_size

    def evaluate(encoder: SentenceEncoder) -> float:
        return stsb_dev_spearman(encoder, data_dir, batch_size=batch_size)

    return evaluate


def build_trainer(config: Config) -> Trainer:
    """Everything :func:`train` sets up, without running the loop."""
    dist_info = init_distributed(
        "cuda" if torch.cuda.is_available() and config.train.device != "cpu" else "cpu"
    )
    seed_everything(config.train.seed)
    cache = Path(config.data.cache_dir) if config.data.cache_dir else cache_root()
    # Rank 0 downloads and writes the token cache first; the other ranks then read it.
    with main_process_first(dist_info):
        encoder = SentenceEncoder.from_config(config.model)
        train_file = resolve_train_file(config.data.train_file, str(cache / "data"))
        corpus, stats = tokenize_corpus(
            train_file,
            encoder.tokenizer,
            config.model.max_seq_len,
            errors=config.data.encoding_errors,
            cache_dir=cache / "tokens",
        )
    objective = build_objective(config.objective)
    if dist_info.is_main:
        log.info(
            "corpus %s: %d sentences (%d blank lines skipped, %d lines with replaced bytes)",
            stats.path, stats.sentences, stats.blank_lines, stats.replaced_lines,
        )  # fmt: skip
    step_fn = None
    if config.train.cache_chunk_size:
        from .gradcache import gradcache_step

        step_fn = gradcache_step
    # Re-seed after model construction so that dropout does not depend on how many random numbers
    # building the model consumed (the data order and generated negatives have their own
    # generators). Each rank gets its own dropout stream.
    seed_everything(dropout_seed(config.train.seed, dist_info.rank))
    return Trainer(
        config, encoder, objective, corpus, make_dev_evaluator(config), dist_info, step_fn
    )


def train(config: Config | str | Path) -> dict[str, Any]:
    """Train as described by ``config`` (a :class:`Config` or a YAML path); returns results."""
    if not isinstance(config, Config):
        config = load_config(config)
    try:
        return build_trainer(config).train()
    finally:
        shutdown_distributed()  # only if init_distributed created the process group
