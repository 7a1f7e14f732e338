"""From a config to a trained model: :func:`build_trainer` assembles, :func:`train` runs.

The composition root of training: it validates the config, starts the distributed group, takes
the output folder's lock and checks the folder (:mod:`.rundir`) before any heavy work, opens the
training data once (its kind decided there: :class:`~cselab.data.source.TrainingSource`), builds
the objective for that kind, loads the model, tokenises, seeds the streams (:mod:`.rng`) and
hands everything to the :class:`~cselab.training.trainer.Trainer`, with the callbacks that write
what leaves the run: the model card of every saved folder and the Hub upload
(:mod:`cselab.publish.callbacks`). It is the one module of training that may import
:mod:`cselab.publish` (``tests/test_layout.py``).

:func:`train` holds the lock (:meth:`RunFolder.lock <cselab.io.runfolder.RunFolder.lock>`,
main process only) from before the folder check to the end of the run, however it ends: a
second run into the same folder stops at once with
:class:`~cselab.core.errors.RunFolderBusy`. ``cselab train`` and every sweep cell (in-process
or ``cselab train`` subprocesses) come through here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import Config, load_config
from ..core.datakind import DataKind
from ..core.errors import ConfigError
from ..data.pairs import source_digest
from ..data.repetition import MAX_REPEATED
from ..data.source import TrainingSource
from ..io.runfolder import RunFolder
from ..model.backbones import FAST_PATH_MODEL_TYPES, noise_free
from ..model.encoder import SentenceEncoder
from ..model.hub import cache_root, resolve_train_file
from ..objectives import VIEW_POSITIVE, VIEW_TOKEN_LOGITS, Objective, build_objective
from ..publish.callbacks import ModelCardCallback, PushCallback
from . import rundir
from .callbacks import Callback
from .distributed import init_distributed, main_process_first, shutdown_distributed
from .rng import dropout_seed, seed_everything
from .selection import make_dev_evaluator
from .trainer import Trainer

log = logging.getLogger("cselab")


def check_sequence_length(config: Config, encoder: SentenceEncoder, objective: Objective) -> None:
    """That a training row fits the model's position embeddings: ``model.max_seq_len`` tokens,
    plus what the step adds to a row: the prompt pooler's template tokens (counted by
    ``encoder.accepted_max_len``) and up to ``MAX_REPEATED - 1`` repeated tokens of ESimCSE's
    word repetition (a repeated row is not cut again, as the authors'). Otherwise the first
    step would index past the position embeddings (a traceback on the CPU, a device assert on
    a GPU); this is one line naming the key, before any training."""
    grown = MAX_REPEATED - 1 if objective.positive_repetition > 0 else 0
    room = encoder.accepted_max_len - grown
    if config.model.max_seq_len > room:
        parts = [f"{config.model.name_or_path} accepts {encoder.accepted_max_len} tokens a row"]
        if encoder.prompt is not None:
            parts.append(f"after the prompt template's {encoder.prompt.extra}")
        if grown:
            parts.append(f"and word repetition adds up to {grown}")
        raise ConfigError(
            f"model.max_seq_len={config.model.max_seq_len} is too long: {' '.join(parts)}; "
            f"use model.max_seq_len <= {room}"
        )


def check_dropout_noise(encoder: SentenceEncoder, kind: DataKind, dropout: float | None) -> None:
    """That a run whose positive is a second dropout view has dropout to draw.

    On sentences, SimCSE's positive (and that of every objective built on it: Focal, GS, DCL,
    MixCSE, ESimCSE, ...) is the same sentence encoded again under another dropout mask (Gao
    et al. 2021, Sec. 3). A backbone without dropout (ModernBERT, and decoders, as released)
    makes it the anchor itself: the loss is about 0 from the first step and nothing is learnt.
    Refused in one line before step 1. Pairs runs have a given positive and are not refused;
    an explicit ``model.dropout: 0`` is the user's choice (equivalence tests use it) and is
    only logged.
    """
    if kind.pairs:
        return
    message = noise_free(encoder.backbone.config)
    if message is None:
        return
    if dropout is None:
        raise ConfigError(message)
    log.warning("model.dropout=%s: the two views of each sentence are the same vector", dropout)


def build_trainer(
    config: Config,
    callbacks: Sequence[Callback] = (),
    hold: contextlib.ExitStack | None = None,
    *,
    defer_push: bool = False,
) -> Trainer:
    """Everything :func:`train` sets up, without running the loop.

    ``hold``: where the main process keeps the output folder's lock, taken before the folder is
    checked; :func:`train` passes a stack that lives as long as the run. Without it no lock is
    taken (the caller owns the folder). ``defer_push``: ``train.push_to_hub``'s upload waits for
    :func:`train` to call it after the process group is destroyed (:class:`PushCallback`).
    """
    tc = config.train
    config.checked()  # a config built in Python fails before any work
    dist_info = init_distributed(
        "cuda" if torch.cuda.is_available() and tc.device != "cpu" else "cpu",
        timeout_s=tc.dist_timeout_s,
    )
    if tc.batch_size % dist_info.world_size:  # every rank takes an equal slice of each batch
        raise ConfigError(
            f"train.batch_size={tc.batch_size} must be divisible by the {dist_info.world_size} "
            "ranks"
        )
    seed_everything(tc.seed)
    cache = Path(config.data.cache_dir) if config.data.cache_dir else cache_root()
    # Rank 0 downloads and writes the token cache first; the other ranks then read it.
    with main_process_first(dist_info):
        train_file = Path(resolve_train_file(config.data.train_file, str(cache / "data")))
        if dist_info.is_main:  # before any heavy work: never replace or mis-resume a run
            if hold is not None:  # first: no other process can start a run after the check
                hold.enter_context(RunFolder(tc.output_dir).lock())
            rundir.prepare_output_dir(
                Path(tc.output_dir), config.to_dict(), lambda: source_digest(train_file),
                tc.resume, tc.overwrite,
            )  # fmt: skip
        evaluator = make_dev_evaluator(config.eval, tc.eval_steps)  # a bad dev file fails early
        # Its kind is decided here, once; a pairs file's columns are checked before the model.
        source = TrainingSource(train_file, config.data)
        objective = build_objective(config.objective, source.kind)
        # token prediction (MNTP) reads the causal LM head, loaded only then
        lm_head = VIEW_TOKEN_LOGITS in objective.required_views
        encoder = SentenceEncoder.from_config(config.model, lm_head=lm_head)
        # model.pooler: null is the architecture's default, resolved by the load: the run's saved
        # config, its card and a resume read the pooler it trained
        config.model.pooler = encoder.pooler.kind
        if config.model.unpad_cuda and not encoder.unpad_cuda:
            log.info(
                "model.unpad_cuda: %s has no forward on the real tokens (model.fast_path: %s; "
                "the architectures with one: %s); it runs the padded forward",
                config.model.name_or_path, config.model.fast_path,
                ", ".join(sorted(FAST_PATH_MODEL_TYPES)),
            )  # fmt: skip
        if encoder.has_adapters and not config.model.lora.enabled:  # frozen: nothing would train
            raise ConfigError(
                f"model.name_or_path={config.model.name_or_path} holds LoRA adapters; merge them "
                "into the weights first (cselab merge FOLDER -o DIR) and train DIR"
            )
        config.objective.matryoshka.validate(width=encoder.dim)  # the width is known now
        check_sequence_length(config, encoder, objective)
        if VIEW_POSITIVE in objective.required_views:  # MNTP has no dropout views
            check_dropout_noise(encoder, source.kind, config.model.dropout)
        if tc.gradient_checkpointing:
            encoder.gradient_checkpointing(True)
        corpus, data = source.tokenize(
            encoder.tokenizer, config.model.max_seq_len, cache_dir=cache / "tokens"
        )
    if dist_info.is_main:
        log.info("%s", source.summary())
    # Re-seed after model construction so that dropout does not depend on how many random numbers
    # building the model consumed (the data order and generated negatives have their own
    # generators). Each rank gets its own dropout stream.
    seed_everything(dropout_seed(tc.seed, dist_info.rank))
    models_out: list[Callback] = [ModelCardCallback(config, data)]
    if tc.push_to_hub:
        push = PushCallback(RunFolder(tc.output_dir).best, tc.push_to_hub, deferred=defer_push)
        models_out.append(push)
    return Trainer(
        config,
        encoder,
        objective,
        corpus,
        evaluator,
        dist_info,
        data_digest=data.sha256,
        callbacks=[*models_out, *callbacks],
        kind=source.kind,
    )


def train(config: Config | str | Path, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train as described by ``config`` (a :class:`Config` or a YAML path); returns results.
    ``callbacks`` are called on every step, evaluation, checkpoint and at the end."""
    config = load_config(config) if not isinstance(config, Config) else config.checked()
    with contextlib.ExitStack() as hold:  # the run folder's lock, released on any exit
        try:
            trainer = build_trainer(config, callbacks, hold, defer_push=True)
            results = trainer.train()
        finally:
            shutdown_distributed()  # only if init_distributed created the process group
        # The upload comes after the process group is gone: however long it takes, no rank
        # waits in a collective (the NCCL watchdog would abort it) and torchrun sees the other
        # ranks end normally; the folder's lock is still held.
        for callback in trainer.callbacks.callbacks:
            if isinstance(callback, PushCallback) and callback.finished:
                callback.push()
        return results
