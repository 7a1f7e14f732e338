"""``resolve(config) -> RunPlan``: the facts of a run, decided once where training starts.

:func:`resolve` opens the training file (its kind decided there, by the data layer:
:class:`~cselab.data.source.TrainingSource`), resolves the dev set
(:func:`~cselab.config.devset.resolve_dev_set`), the device and ``train.precision: auto``
(:mod:`cselab.training.runtime`, asked of this rank's GPU), the number of processes (from the
environment: the process group forms later), the pooler of ``model.pooler: null`` and the
encoder's width from the model's ``config.json`` (read once, without the weights; a Hub name or
a folder of adapters leaves them to the model's load) and Matryoshka's prefixes, and keeps the
validated ``objective`` section (checked against the data kind by
:func:`~cselab.objectives.build_objective`, which builds it for that kind). The result is a
frozen :class:`~cselab.config.plan.RunPlan`; the composition root (:mod:`.train`) hands its
facts to the trainer, model selection and the model card, and saves it in the run folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from ..config import Config, compile_with_denoising
from ..config.devset import STSB, DevSet, resolve_dev_set
from ..config.plan import RunPlan, as_lora_targets
from ..data.source import TrainingSource
from ..io.readers import read_json
from ..model.backbones import default_pooler
from ..model.choices import BATCH_SIZE
from ..model.devices import gpu, is_gpu, precision_name
from ..model.encoder import SentenceEncoder
from ..model.lora import adapter_settings, is_adapter_folder
from ..model.st_folder import recorded_settings, transformer_folder
from ..training.distributed import DistInfo
from ..training.runtime import autocast_dtype, pick_device

log = logging.getLogger("cselab")


def model_facts(name_or_path: str, pooler: str | None) -> tuple[str | None, int | None]:
    """``(pooler, width)`` of a model from its local ``config.json`` (read once, no weights):
    ``pooler`` as given, else the one a folder saved by cselab records, else the table of
    backbones' default for its ``model_type``
    (:func:`~cselab.model.backbones.default_pooler`, as the load resolves it); ``(pooler,
    None)`` when there is no local ``config.json`` (a Hub name, a folder of adapters): the
    load resolves them then."""
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir() or is_adapter_folder(folder):
        return pooler, None
    data = read_json(transformer_folder(folder) / "config.json")
    if data is None:
        return pooler, None
    if pooler is None:  # the folder's recorded pooler, else the architecture's
        recorded = recorded_settings(folder).get("pooler")
        pooler = recorded or default_pooler(SimpleNamespace(**data))
    width = data.get("hidden_size")
    return pooler, int(width) if isinstance(width, int) else None


#: Whether ``train.compile``'s ``null``s capture the encoder in CUDA graphs on a GPU. Off until
#: the GPU tests of the graph step (``tests/test_gpu.py``: its loss and gradients equal the
#: eager step's, alone and under GradCache) pass on a GPU; measured so far:
#: ``docs/results/gpu_benchmark.md``.
GRAPHS_BY_DEFAULT = False

#: STS-B dev's encoding batch on a GPU where ``eval.batch_size`` is ``null``: its 3,000 short
#: sentences in three forwards, where batches of 128 left the GPU waiting for the host to
#: launch 24 forwards' kernels (``docs/results/gpu_benchmark.md``). Other dev sets, whose
#: texts may be long, keep :data:`~cselab.model.choices.BATCH_SIZE`.
GPU_EVAL_BATCH_SIZE = 1024


def dev_encoding(
    batch_size: int | None,
    device: str,
    precision: str,
    dev: DevSet | None,
    previous: RunPlan | None = None,
) -> tuple[int, str]:
    """How model selection encodes the dev set ``dev`` on ``device`` for a run trained in
    ``precision``: ``(batch size, precision)``.

    ``eval.batch_size: null`` is :data:`GPU_EVAL_BATCH_SIZE` for STS-B dev on a GPU, else
    :data:`~cselab.model.choices.BATCH_SIZE`. On a GPU the STS pairs (STS-B dev, a file of
    pairs) are encoded under the step's autocast (bf16 where the run trains in bf16, as
    Hugging Face's Trainer evaluates under ``bf16=True``): in fp32 without TF32 a BERT-base
    forward of STS-B dev is compute-bound at a quarter of a second. On the CPU, and for a BEIR
    folder (encoded through ``encode()``), it stays fp32. A run resumed on the same kind of
    device (``previous``, its plan) keeps the precision its scores so far were measured in,
    and its batch size where ``eval.batch_size`` is ``null`` (a plan saved before the encoding
    was resolved: 128, fp32); on another kind (a GPU run resumed on the CPU) it is resolved
    afresh, as the training precision is.
    """
    gpu_run = is_gpu(torch.device(device))
    pairs = dev is not None and dev.kind != "retrieval"
    if previous is not None and is_gpu(torch.device(previous.device)) == gpu_run:
        return batch_size or previous.eval_batch_size, previous.eval_precision if pairs else "fp32"
    stsb = dev is not None and dev.kind == STSB
    size = batch_size or (GPU_EVAL_BATCH_SIZE if gpu_run and stsb else BATCH_SIZE)
    return size, precision if gpu_run and pairs else "fp32"


def compile_mode(config: Config, device: str, pooler: str | None = None) -> str | None:
    """The ``torch.compile`` mode of the run's encoder, ``None`` for eager: ``train.compile``
    and ``train.compile_mode`` with their ``null`` resolved for ``device`` (``pooler``: the
    run's, resolved; default the config's).

    ``train.compile: null`` is eager on the CPU, and on a GPU unless :data:`GRAPHS_BY_DEFAULT`
    is on: then a GPU run compiles with CUDA graphs (``reduce-overhead``: the step's kernels
    replayed without the host launching each, which is what the eager step waits for), except
    where a part of the run has not been measured through them (gradient checkpointing, LoRA
    adapters, PromptBERT's template denoising). ``train.compile_mode: null`` is that
    ``reduce-overhead`` where :data:`GRAPHS_BY_DEFAULT` is on and the device a GPU, else
    ``default`` (Inductor, dynamic shapes); ``train.compile_mode=reduce-overhead`` asks for
    the graphs explicitly (a mode given with ``train.compile: null`` compiles; with ``false``,
    as configs saved by earlier versions record, it does not).
    """
    tc, m = config.train, config.model
    graphs = GRAPHS_BY_DEFAULT and is_gpu(torch.device(device))
    denoise = (pooler or m.pooler) == "prompt" and m.prompt.denoise
    on = tc.compile_asked
    if on is None:
        on = graphs and not (tc.gradient_checkpointing or m.lora.enabled or denoise)
    if not on:
        return None
    if denoise:  # the prompt pooler a saved folder records (the config check saw null)
        raise compile_with_denoising()
    return tc.compile_mode or ("reduce-overhead" if graphs else "default")


def resolve_dev(config: Config) -> DevSet | None:
    """The run's dev set (``eval.dev``, ``eval.dev_metric``, ``eval.dev_columns``), resolved
    once: training asks it first, before anything is written, so that a bad dev file leaves
    nothing behind, and hands it to :func:`resolve`."""
    ec = config.eval
    return resolve_dev_set(ec.dev, ec.dev_metric, ec.dev_columns)


def resolve(
    config: Config,
    train_file: str | Path,
    dist: DistInfo,
    dev: DevSet | None = None,
    previous: RunPlan | None = None,
) -> tuple[RunPlan, TrainingSource]:
    """The plan of a run of ``config`` on ``train_file`` (downloaded already) for this process,
    and the opened training source (tokenised later, under the token cache's lock). ``dev``:
    the dev set when the caller resolved it already (:func:`resolve_dev`); else it is resolved
    here. ``previous``: the plan of the run a resume continues (its ``plan.json``): a
    ``model.pooler: null`` is the pooler that run trained, not today's default.

    The model's load finishes the plan (:func:`finish`): nothing else changes it.

    Raises:
        ConfigError, CorpusError: naming the key or the file (a pairs file's columns are checked
            here, from its header, before the model loads).
    """
    tc = config.train
    if unused := config.model.lora.unused():
        log.warning("%s set while model.lora.r is 0 (LoRA off): no effect", ", ".join(unused))
    source = TrainingSource(train_file, config.data)
    device = pick_device(tc.device, dist)
    # The rank's own GPU answers whether it has bf16 (cuda:LOCAL_RANK; the process group, which
    # makes it the current device, forms later): asked of cuda:0, a mixed node would be wrong
    rank_device = gpu(dist.local_rank) if is_gpu(device) and device.index is None else device
    precision = precision_name(autocast_dtype(tc.precision, rank_device))  # logged once, here
    asked = config.model.pooler or (previous.pooler if previous is not None else None)
    pooler, width = model_facts(config.model.name_or_path, asked)
    if dev is None:
        dev = resolve_dev(config)
    eval_batch_size, eval_precision = dev_encoding(
        config.eval.batch_size, str(device), precision, dev, previous
    )
    plan = RunPlan(
        # absolute: a card written later from another working directory hashes the same file
        train_file=os.path.abspath(source.path),
        kind=source.kind,
        dev=dev,
        device=str(device),
        precision=precision,
        world_size=dist.world_size,
        pooler=pooler,
        width=width,
        matryoshka_dims=tuple(config.objective.matryoshka.dims or ()),
        objective=config.objective,
        compile_mode=compile_mode(config, str(device), pooler),
        eval_batch_size=eval_batch_size,
        eval_precision=eval_precision,
    )
    return plan, source


def finish(plan: RunPlan, encoder: SentenceEncoder) -> RunPlan:
    """The plan with what only the model's load knows: the pooler it built (``model.pooler:
    null`` on a Hub name or a folder of adapters), its attention, its width, and the modules LoRA adapters were
    put on (the architecture's default unless named); Matryoshka's prefixes are checked against
    that width here, once.

    Raises:
        ConfigError: naming ``objective.matryoshka.dims``.
    """
    targets = adapter_settings(encoder.backbone)["target_modules"] if encoder.has_adapters else None
    plan = plan.replace(
        pooler=encoder.pooler.kind,
        width=plan.width or encoder.dim,
        lora_targets=as_lora_targets(targets),
        bidirectional=bool(encoder.bidirectional),
    )
    plan.objective.matryoshka.validate(width=plan.width)
    return plan


__all__ = ["compile_mode", "finish", "model_facts", "resolve", "resolve_dev"]
