"""From a config to a trained model: :func:`build_trainer` assembles, :func:`train` runs.

The composition root of training, above every layer it assembles (``tests/test_layout.py``):
it validates the config, takes the output folder's lock and checks the folder
(:mod:`cselab.training.rundir`) before any heavy work, resolves the run's facts once
(:func:`.plan.resolve`: the data kind, dev set, device, precision, pooler, objective; a
:class:`~cselab.config.plan.RunPlan`, which the trainer writes beside ``config.yaml`` when its
loop starts), builds the objective for that
kind, loads the model, tokenises, forms the process group, seeds the streams and builds the
trainer's collaborators (:func:`assemble_trainer`: the loggers, the objective's context, the
:class:`~cselab.training.task.Task`, the optimiser, model selection), with the callbacks that
write what leaves the run: the model card of every saved folder and the Hub upload
(:mod:`cselab.publish.callbacks`).

No rank waits in a collective while another works: each rank downloads, loads the model and
tokenises before the process group forms (knowing its rank from the environment), and the
cache's file locks (:func:`~cselab.data.cache.cache_lock`, one per download and per token-cache
entry) let the first rank fill the cache while the others wait in ``flock`` and then read it.

:func:`train` holds the lock (:meth:`RunFolder.lock <cselab.io.runfolder.RunFolder.lock>`,
main process only) from before the folder check to the end of the run, however it ends: a
second run into the same folder stops at once with
:class:`~cselab.core.errors.RunFolderBusy`. ``cselab train``, ``cselab.train`` and every sweep
cell (in-process or ``cselab train`` subprocesses) come through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import Config, load_config
from ..config.devset import DevSet
from ..config.plan import RunPlan
from ..core.datakind import DataKind
from ..core.errors import ConfigError
from ..core.prompts import default_prompt_from_data, model_prompts_from_data
from ..data.cache import cache_lock
from ..data.order import BatchOrder, shard_bounds
from ..data.pairs import TokenizedPairs, evaluation_notes, source_digest
from ..data.store import TokenizedCorpus
from ..io.files import refuse_file_in_the_way
from ..io.runfolder import RunFolder
from ..model.backbones import noise_free
from ..model.devices import is_gpu
from ..model.encoder import SentenceEncoder, compile_encoder
from ..model.hub import DOWNLOADS, cache_root, resolve_train_file
from ..model.lora import merge_first
from ..objectives import (
    VIEW_POSITIVE,
    VIEW_TOKEN_LOGITS,
    Objective,
    ObjectiveContext,
    build_objective,
)
from ..publish.callbacks import ModelCardCallback, PushCallback
from ..publish.push import check_push
from ..training import rundir
from ..training.batches import StepBatches
from ..training.callbacks import Callback, CallbackList, report_callbacks
from ..training.distributed import (
    DistInfo,
    broadcast_module,
    dist_from_env,
    gather_with_grad,
    init_distributed,
    shutdown_distributed,
)
from ..training.finish import EvaluationNotes, MatryoshkaScores, RunOutputs
from ..training.optim import Optimization
from ..training.rng import dropout_seed, seed_everything
from ..training.runstate import RunState
from ..training.runtime import precision_dtype, retain_freed_memory
from ..training.selection import Evaluator, ModelSelection, make_dev_evaluator
from ..training.task import Task
from ..training.trainer import LoopSettings, Trainer
from .plan import finish, resolve, resolve_dev

log = logging.getLogger("cselab")

#: ``train.compile_mode=reduce-overhead``: batch widths are padded to multiples of this.
FIXED_SHAPE_MULTIPLE = 16
#: Batches collated ahead on a background thread on a GPU (:class:`~cselab.data.prefetch.Prefetch`)
PREFETCH_DEPTH = 2


def check_sequence_length(config: Config, encoder: SentenceEncoder, objective: Objective) -> None:
    """That a training row fits the model's position embeddings: ``model.max_seq_len`` tokens,
    plus what the step adds to a row: the prompt pooler's template tokens (counted by
    ``encoder.accepted_max_len``) and the tokens the objective's ``prepare`` may add (ESimCSE's
    word repetition: up to 9, a repeated row is not cut again). Otherwise the first
    step would index past the position embeddings (a traceback on the CPU, a device assert on
    a GPU); this is one line naming the key, before any training."""
    grown, what = objective.added_tokens()
    room = encoder.accepted_max_len - grown
    if config.model.max_seq_len > room:
        parts = [f"{config.model.name_or_path} accepts {encoder.accepted_max_len} tokens a row"]
        if encoder.prompt is not None:
            parts.append(f"after the prompt template's {encoder.prompt.extra}")
        if grown:
            parts.append(f"and {what} adds up to {grown}")
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


@dataclasses.dataclass
class OpenRun:
    """What :func:`open_run` found before any heavy work: this process's place in the run,
    the dev set and its evaluator, the cache, the interrupted run's plan (on resume), the
    training file, and the results of a run that had already finished (``None`` otherwise)."""

    here: DistInfo
    dev: DevSet | None
    evaluator: Evaluator | None
    cache: Path
    previous: RunPlan | None
    train_file: Path
    finished: dict[str, Any] | None


def open_run(config: Config, hold: contextlib.ExitStack | None = None) -> OpenRun:
    """The checks before any heavy work (the batch against the ranks, the dev file, the cache
    folder, the output folder under its lock, a named corpus fetched), in that order, and on
    resume the interrupted run's resolved facts and whether it had already finished
    (:func:`~cselab.training.rundir.finished_results`, read by every rank from the folder:
    the process group does not exist yet). ``hold``: as :func:`build_trainer`'s."""
    tc = config.train
    config.checked()  # a config built in Python fails before any work
    here = dist_from_env()  # the process group forms once the heavy work is done
    if tc.batch_size % here.world_size:  # every rank takes an equal slice of each batch
        raise ConfigError(
            f"train.batch_size={tc.batch_size} must be divisible by the {here.world_size} ranks"
        )
    seed_everything(tc.seed)
    if tc.warmup_steps and tc.warmup_ratio and here.is_main:  # a saved config may hold both
        log.warning(
            "train.warmup_steps=%d and train.warmup_ratio=%g both set: the warm-up is %d steps",
            tc.warmup_steps, tc.warmup_ratio, tc.warmup_steps,
        )  # fmt: skip
    # The dev set first: a bad dev file fails before anything is written (cache, run folder)
    dev = resolve_dev(config)
    scored = dev
    if tc.eval_steps is None and not config.eval_cadence:  # MNTP's default: no dev data read
        scored = None
        if here.is_main:
            log.info(
                "objective.mntp: no model selection (masked next-token prediction does not "
                "train for similarity), the last step is kept; train.eval_steps=N scores a dev set"
            )
    evaluator = make_dev_evaluator(config.eval, config.eval_cadence, scored)
    cache = Path(config.data.cache_dir) if config.data.cache_dir else cache_root()
    # one line, not a NotADirectoryError deep down
    refuse_file_in_the_way(cache, f"data.cache_dir={cache}", ConfigError)
    if here.is_main and hold is not None:  # first: no other process can start a run here
        hold.enter_context(RunFolder(tc.output_dir).lock())
    previous = None
    if tc.resume:  # every rank: what the interrupted run asked for, and what it resolved
        rundir.adopt_resolved_on_load(config, Path(tc.output_dir))
        previous = RunPlan.load(tc.output_dir)
    # A named corpus not on disk yet: one rank downloads it, the others wait in flock, in no
    # collective; one already there (or a local file) takes no lock, so a read-only cache works
    name, data_dir = config.data.train_file, str(cache / "data")
    train_file = Path(resolve_train_file(name, data_dir, download=False))
    if not train_file.is_file() and name in DOWNLOADS:
        with cache_lock(cache, f"download-{name}", "downloading"):
            train_file = Path(resolve_train_file(name, data_dir))
    if tc.push_to_hub and here.is_main and not tc.resume:  # before an old run is replaced
        check_push(tc.push_to_hub)
    if here.is_main:  # before any heavy work: never replace or mis-resume a run
        rundir.prepare_output_dir(
            Path(tc.output_dir), config.to_dict(), lambda: source_digest(train_file),
            tc.resume, tc.overwrite,
        )  # fmt: skip
    # a finished run's resume is known here, before minutes go into loading a large model
    finished = rundir.finished_results(Path(tc.output_dir)) if tc.resume else None
    if finished is None and tc.push_to_hub and here.is_main and tc.resume:  # not after hours
        check_push(tc.push_to_hub)
    return OpenRun(here, dev, evaluator, cache, previous, train_file, finished)


def build_trainer(
    config: Config,
    callbacks: Sequence[Callback] = (),
    hold: contextlib.ExitStack | None = None,
    *,
    defer_push: bool = False,
    opened: OpenRun | None = None,
) -> Trainer:
    """Everything :func:`train` sets up, without running the loop.

    ``hold``: where the main process keeps the output folder's lock, taken before the folder is
    checked; :func:`train` passes a stack that lives as long as the run. Without it no lock is
    taken (the caller owns the folder). ``defer_push``: ``train.push_to_hub``'s upload waits for
    :func:`train` to call it after the process group is destroyed (:class:`PushCallback`).
    ``opened``: :func:`open_run`'s checks, done already (else done here). A finished run's
    trainer loads its model and returns the results from :meth:`Trainer.train`; :func:`train`
    returns them without loading it.
    """
    tc = config.train
    opened = opened or open_run(config, hold)
    here, dev, evaluator, cache = opened.here, opened.dev, opened.evaluator, opened.cache
    train_file, previous = opened.train_file, opened.previous
    # The run's facts, once: the data kind (a pairs file's columns checked before the model),
    # the dev set, device, precision, pooler; the load finishes the plan, and nothing after
    # that derives them again (the config is never changed).
    plan, source = resolve(config, train_file, here, dev, previous)
    objective = build_objective(plan.objective, plan.kind)
    # token prediction (MNTP) reads the causal LM head, loaded only then
    lm_head = VIEW_TOKEN_LOGITS in objective.required_views
    # a copy: the plan's pooler, and the prompts the model is saved with (config is unchanged)
    model = dataclasses.replace(config.model, pooler=plan.pooler, **saved_prompts(config, plan))
    encoder = SentenceEncoder.from_config(model, lm_head=lm_head)
    plan = finish(plan, encoder)
    if encoder.has_adapters and not model.lora.enabled:  # frozen: nothing would train
        raise ConfigError(merge_first(model.name_or_path))
    check_sequence_length(config, encoder, objective)
    if VIEW_POSITIVE in objective.required_views:  # MNTP has no dropout views
        check_dropout_noise(encoder, plan.kind, model.dropout)
    if tc.gradient_checkpointing:
        encoder.gradient_checkpointing(True)
    # the first rank tokenises, under the entry's lock; the others then read its entry
    corpus, data = source.tokenize(
        encoder.tokenizer, model.max_seq_len, cache_dir=cache / "tokens",
        pool_prompt=model.pool_prompt, prompt_count=encoder.prompt_count,
    )  # fmt: skip
    dist_info = init_distributed(plan.device, timeout_s=tc.dist_timeout_s)
    if dist_info.is_main:
        log.info("%s", source.summary())
    # Re-seed after model construction so that dropout does not depend on how many random numbers
    # building the model consumed (the data order and generated negatives have their own
    # generators). Each rank gets its own dropout stream.
    seed_everything(dropout_seed(tc.seed, dist_info.rank))
    models_out: list[Callback] = [
        ModelCardCallback(as_trained(config, plan), data, plan, objective)
    ]
    if tc.push_to_hub:
        push = PushCallback(RunFolder(tc.output_dir).best, tc.push_to_hub, deferred=defer_push)
        models_out.append(push)
    return assemble_trainer(
        config, plan, encoder, objective, corpus, evaluator, dist_info, data_digest=data.sha256,
        callbacks=[*models_out, *callbacks], notes=evaluation_notes(config.data),
    )  # fmt: skip


def as_trained(config: Config, plan: RunPlan) -> Config:
    """A copy of ``config`` naming the pooler and attention the plan resolved and the prompts the
    model is saved with (:func:`saved_prompts`): what the run folder's
    ``config.yaml``, its checkpoints and its model folders record (the pooler the run trained,
    which a resume naming it compares equal to). ``config`` itself is never changed."""
    model = dataclasses.replace(
        config.model, pooler=plan.pooler, bidirectional=plan.bidirectional,
        **saved_prompts(config, plan),
    )  # fmt: skip
    return dataclasses.replace(config, model=model)


def saved_prompts(config: Config, plan: RunPlan) -> dict[str, Any]:
    """The prompts the trained model is saved with when ``model.prompts`` names none: those of
    ``data.prompts`` (the anchor's as ``query``, the positive's as ``document``; a sentence
    corpus's one prompt as both, and the default; docs/prompts.md)."""
    if config.model.prompts or not config.data.prompts:
        return {}
    pairs = plan.kind.pairs
    default = config.model.default_prompt_name or default_prompt_from_data(
        config.data.prompts, pairs
    )
    return {
        "prompts": model_prompts_from_data(config.data.prompts, pairs),
        "default_prompt_name": default,
    }


def _unbound() -> Path:
    raise RuntimeError("ModelSelection.save_best is bound by the Trainer")


def loop_settings(config: Config, total_steps: int, steps_per_epoch: int) -> LoopSettings:
    """The loop's cadences from the ``train`` section."""
    tc = config.train
    return LoopSettings(
        total_steps=total_steps, steps_per_epoch=steps_per_epoch, batch_size=tc.batch_size,
        log_steps=tc.log_steps, eval_steps=config.eval_cadence, save_steps=tc.save_steps,
        save_minutes=tc.save_minutes, chunk=tc.cache_chunk_size or 0, resume=tc.resume,
    )  # fmt: skip


def assemble_trainer(
    config: Config,
    plan: RunPlan,
    encoder: SentenceEncoder,
    objective: Objective,
    corpus: TokenizedCorpus | TokenizedPairs,
    evaluator: Evaluator | None = None,
    dist_info: DistInfo | None = None,
    *,
    data_digest: str | None = None,
    callbacks: Sequence[Callback] = (),
    notes: Sequence[str] = (),
) -> Trainer:
    """The trainer's collaborators, built from the config's settings and the run's ``plan``
    (:func:`.plan.resolve`, finished by :func:`.plan.finish`; benchmarks that build parts by
    hand resolve one too), and the trainer.

    The loggers of ``train.report_to`` and the callbacks that end the run (the Matryoshka scores,
    ``notes``, ``results.json``, the merge) before ``callbacks`` (main process only), the
    encoder on the plan's device (rank 0's weights on every rank, as DDP starts), the batch
    order, the objective's context (the one gather helper, this rank's offset, the generator),
    the possibly compiled forward, the :class:`~cselab.training.task.Task`, the optimiser, model
    selection and what the run keeps (:class:`~cselab.training.runstate.RunState`).
    """
    tc, written = config.train, as_trained(config, plan)
    dist = dist_info or DistInfo()
    # this rank's device, as the plan resolved it (cuda:LOCAL_RANK under torchrun)
    device, amp_dtype = torch.device(plan.device), precision_dtype(plan.precision)
    encoder = encoder.to(device)
    broadcast_module(encoder)  # every rank starts from rank 0's weights (as DDP does)
    unit = "pairs" if isinstance(corpus, TokenizedPairs) else "sentences"
    order = BatchOrder(
        len(corpus), tc.batch_size, tc.seed, source=config.data.train_file, unit=unit
    )
    total_steps = tc.max_steps or order.batches_per_epoch * tc.epochs
    if device.type == "cpu":
        retain_freed_memory()  # page faults are a tenth of a CPU step otherwise
    ctx = ObjectiveContext(
        gather=gather_with_grad,
        rank=dist.rank,
        world_size=dist.world_size,
        offset=shard_bounds(tc.batch_size, dist.rank, dist.world_size)[0],
        generator=torch.Generator(device=device),
    )
    mode = plan.compile_mode  # None: eager
    width_multiple = FIXED_SHAPE_MULTIPLE if mode == "reduce-overhead" else None
    forward = encoder
    if mode is not None:
        options: dict[str, Any] = {} if mode == "default" else {"mode": mode}
        if width_multiple:
            options["dynamic"] = False
        forward = compile_encoder(encoder, **options)
    kind = plan.kind
    task = Task(
        forward, objective.to(device), ctx, seed=tc.seed, amp_dtype=amp_dtype, kind=kind,
        graphs=mode == "reduce-overhead" and is_gpu(device),
    )  # fmt: skip
    trainable = [p for p in encoder.parameters() if p.requires_grad]
    optim = Optimization(trainable, tc, total_steps, device, amp_dtype)
    selection = ModelSelection(evaluator, _unbound, dist.is_main)
    if selection.evaluator is not None:
        selection.evaluator.encode_with(plan.eval_batch_size, plan.eval_precision)
        if dist.is_main:
            log.info(
                "the dev set is encoded in batches of %d, %s, on %s",
                plan.eval_batch_size, plan.eval_precision, plan.device,
            )  # fmt: skip
    listeners = CallbackList()
    run = RunState(written, plan, encoder, task, optim, selection, dist, listeners, data_digest)
    if dist.is_main:
        loggers = report_callbacks(tc.report_to, tc.output_dir, written.to_dict())
        ending = [
            MatryoshkaScores(
                run, plan.matryoshka_dims, plan.eval_batch_size, config.model.fast_path
            ),
            EvaluationNotes(notes),
            RunOutputs(run, listeners, merge=tc.save_merged, rows=len(corpus)),
        ]
        listeners.callbacks = [*loggers, *ending, *callbacks]
    pad_id = int(encoder.tokenizer.pad_token_id or 0)
    # on a GPU the next batches are collated on a thread while the device works (no effect on
    # what they hold); on the CPU the step itself uses every core
    ahead = PREFETCH_DEPTH if is_gpu(device) else 0
    batches = StepBatches(corpus, order, task, device, dist, pad_id, width_multiple, ahead)
    loop = loop_settings(config, total_steps, order.batches_per_epoch)
    return Trainer(task, optim, batches, loop, listeners, plan, run)


def as_config(config: Config | str | os.PathLike[str] | Mapping[str, Any]) -> Config:
    """``config`` checked: a :class:`Config`, a YAML path or a preset's name
    (:func:`~cselab.config.load_config`), or its sections as a mapping (``{"train": {...}}``,
    read as a YAML file's)."""
    if isinstance(config, Config):
        return config.checked()
    if isinstance(config, str | os.PathLike):
        return load_config(config)
    if isinstance(config, Mapping):
        return Config.from_sections(config)
    raise ConfigError(
        "config must be a Config, a YAML path, a preset's name or a mapping of sections, "
        f"not {type(config).__name__}"
    )


def train(
    config: Config | str | os.PathLike[str] | Mapping[str, Any], callbacks: Sequence[Callback] = ()
) -> dict[str, Any]:
    """Train as described by ``config`` (a :class:`Config`, a YAML path, a preset's name or
    the sections as a mapping: :func:`as_config`); returns results. ``callbacks`` are called
    on every step, evaluation, checkpoint and at the end."""
    config = as_config(config)
    with contextlib.ExitStack() as hold:  # the run folder's lock, released on any exit
        try:
            opened = open_run(config, hold)
            if opened.finished is not None:  # nothing to do: said, and the model never loaded
                if opened.here.is_main:
                    step = opened.finished["steps"]
                    tc = config.train
                    rundir.say_finished(Path(tc.output_dir), step, tc.push_to_hub, tc.save_merged)
                return opened.finished if opened.here.is_main else {}
            trainer = build_trainer(config, callbacks, hold, defer_push=True, opened=opened)
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
