"""Resumable checkpoints in one safetensors file, written atomically.

A checkpoint holds the model weights (with LoRA, the trainable tensors only:
:func:`model_state`), the optimizer state, the scheduler state, the task's state
across steps (an objective's queue and the momentum encoder's weights, ESimCSE;
:meth:`Task.state_dict <cselab.training.task.Task.state_dict>`), the RNG states of every rank (each rank draws its own dropout masks, so each resumes its own stream), the data
position (the step), the best dev score so far and the resolved config. Tensors go in
the safetensors body, everything else as JSON in its metadata: no pickle anywhere, so loading a
checkpoint never executes code. The file is written to a temporary name and ``os.replace``-d over
the previous one, so a crash or kill mid-write leaves the last complete checkpoint intact; a
failed write (disk full, permission denied) removes the partial file and raises one
:class:`CheckpointWriteError` naming the path and the cause.

The trainer does not wait for the disk: :func:`snapshot_checkpoint` copies the state to host
memory (all the step waits for), and :class:`BackgroundWriter` writes that copy on a thread,
one write at a time; its error reaches the loop at the next logged step, the next checkpoint or
the end of the run, which waits for the write in flight. Model selection's ``best/`` folder is
written the same way, from :func:`snapshot_encoder`'s host copy of the model, and published as
one folder (:func:`publish_folder`); it goes through the same writer, so a checkpoint that
records a new best step is written only after that ``best/`` is.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..config import Config, save_config
from ..core.errors import CheckpointWriteError, WriteError
from ..core.schema import ConfigError
from ..io.files import give_umask_mode
from ..io.runfolder import RunFolder
from ..model.encoder import SentenceEncoder
from .rng import RNGRecord, RNGState


def _cause(err: BaseException) -> str:
    """``No space left on device (ENOSPC)`` for an ``OSError``, the message otherwise
    (safetensors reports I/O errors as ``SafetensorError`` text). A file of the folder written
    atomically (the config, the model card) fails as a ``WriteError`` raised from the
    ``OSError``: the cause is that error's."""
    if isinstance(err, WriteError) and isinstance(err.__cause__, OSError):
        err = err.__cause__
    if isinstance(err, OSError) and err.errno is not None:
        return f"{err.strerror or os.strerror(err.errno)} ({errno.errorcode.get(err.errno, err.errno)})"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


@contextlib.contextmanager
def publishing(target: Path, what: str, partial: Path) -> Iterator[None]:
    """Turn an I/O failure while writing ``partial`` (to be renamed to ``target``) into one
    :class:`CheckpointWriteError` naming ``target`` and the cause; ``partial`` is removed, so
    the disk holds the previous complete ``target`` (if any) and nothing else."""
    try:
        yield
    except (OSError, SafetensorError) as err:
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
        kept = "the previous one is kept" if target.exists() else "none was written before"
        raise CheckpointWriteError(
            f"could not write {what} {target}: {_cause(err)}; {kept}"
        ) from None


# 2: one RNG record per rank (``rng.<rank>.torch`` / ``rng.<rank>.cuda``).
FORMAT_VERSION = 2


def rng_record(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any], rank: int
) -> RNGRecord | None:
    """Rank ``rank``'s RNG record in a loaded checkpoint, or ``None`` if it holds none (the run
    that wrote it had fewer ranks)."""
    per_rank = meta["rng"]
    if rank >= len(per_rank):
        return None
    prefix = f"rng.{rank}."
    rec = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    return rec, per_rank[rank]


#: Prefix of the task's state (:func:`snapshot_checkpoint`'s ``state``) among a checkpoint's tensors.
TASK_PREFIX = "task."


def task_state(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The task's state saved with a checkpoint (``state`` of :func:`snapshot_checkpoint`)."""
    return {k.removeprefix(TASK_PREFIX): v for k, v in tensors.items() if k.startswith(TASK_PREFIX)}


def _split_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            name = f"optim.{idx}.{key}"
            if torch.is_tensor(value):
                tensors[name] = value
            else:
                scalars[name] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        if not name.startswith("optim."):
            continue
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors a checkpoint keeps: all of them, or, when some parameters are frozen
    (LoRA: the base model's weights), the trainable parameters only; the frozen weights are
    loaded again from the base model on resume, so an 8B model's checkpoint holds megabytes."""
    params = dict(model.named_parameters())
    if all(p.requires_grad for p in params.values()):
        return model.state_dict()
    return {k: p for k, p in params.items() if p.requires_grad}


def load_model_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load :func:`model_state`'s tensors: a partial state must cover every trainable
    parameter, and name nothing the model lacks (a checkpoint of another model)."""
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    trainable = {k for k, p in model.named_parameters() if p.requires_grad}
    if unexpected or trainable & set(missing) or (missing and len(state) != len(trainable)):
        raise ConfigError(
            "the checkpoint's model tensors do not fit this model (missing "
            f"{sorted(trainable & set(missing))[:3]}, unexpected {sorted(unexpected)[:3]}); "
            "start the run again with --train.overwrite=true"
        )


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint's content held in host memory, detached from the live training state:
    copies of every tensor and the metadata already serialised, so that training may go on
    changing the model, the optimiser and the selection while :func:`write_snapshot` writes it."""

    step: int
    tensors: dict[str, torch.Tensor]
    metadata: str

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A private CPU copy of ``t`` (on the CPU ``.cpu()`` returns the same storage, which the
    next optimiser step would change under a writer thread)."""
    return t.detach().to("cpu", copy=True).contiguous()


def snapshot_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    extra: dict[str, Any],
    rng: list[RNGRecord] | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
) -> Snapshot:
    """Copy a checkpoint to host memory, for :func:`write_snapshot`. ``rng`` holds one
    :meth:`RNGState.to_record` record per rank, in rank order (default: this process's only, for
    a single-process run); ``state`` is the task's (:func:`task_state` reads it back).

    This is the part of a checkpoint the step waits for: a copy of the model, the optimiser's
    moments and the task state (for BERT-base with AdamW about 1.3 GB, a device-to-host copy on
    a GPU, a ``memcpy`` on the CPU); the file itself is written by :func:`write_snapshot`,
    which :class:`BackgroundWriter` runs on a thread."""
    tensors = {f"model.{k}": _host_copy(v) for k, v in model_state(model).items()}
    opt_tensors, opt_meta = _split_optimizer(optimizer.state_dict())
    tensors.update({k: _host_copy(v) for k, v in opt_tensors.items()})
    for k, v in (state or {}).items():
        tensors[f"{TASK_PREFIX}{k}"] = _host_copy(v)
    records = rng if rng is not None else [RNGState.capture(host=True).to_record()]
    for r, (rng_tensors, _) in enumerate(records):
        tensors.update({f"rng.{r}.{k}": _host_copy(v) for k, v in rng_tensors.items()})
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    meta = {
        "format": FORMAT_VERSION,
        "step": step,
        "optimizer": opt_meta,
        "scheduler": sched,
        "rng": [rng_meta for _, rng_meta in records],
        "extra": extra,
    }
    # serialised now: the selection's history and the optimiser's groups change after the step
    return Snapshot(step, tensors, json.dumps(meta))


def write_snapshot(path: str | Path, snapshot: Snapshot) -> Path:
    """Write ``snapshot`` as the checkpoint file of the folder ``path`` atomically (a temporary
    file, ``fsync``, one rename); returns the file path. A failed write is one
    :class:`CheckpointWriteError` and the previous file is kept (:func:`publishing`)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / RunFolder.CHECKPOINT_FILE
    tmp = folder / (RunFolder.CHECKPOINT_FILE + ".tmp")
    with publishing(target, "checkpoint", tmp):
        save_file(snapshot.tensors, str(tmp), metadata={"cselab": snapshot.metadata})
        give_umask_mode([tmp])  # as the run folder's other files (safetensors writes 0600)
        with open(tmp, "rb+") as fh:  # make the bytes durable before the rename publishes them
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    return target


#: the kinds of :class:`BackgroundWriter`'s writes (its thread is named ``cselab-<kind>``)
CHECKPOINT_WRITE, MODEL_WRITE = "checkpoint", "model"


class BackgroundWriter:
    """Writes checkpoint snapshots (and model folders from :func:`snapshot_encoder`'s copy) on
    a thread, one at a time, so that the step does not wait for the disk.

    :meth:`submit` first waits for the write in flight, if any (at most one is in flight, so at
    most two snapshots are held in memory), and raises its error; then starts the next one.
    :meth:`wait` blocks until nothing is in flight and raises the error of the last write. A
    write's error therefore reaches the training loop at the next checkpoint, at the end of the
    run, or at :meth:`check` (called at every logged step), never later. Atomicity is
    :func:`write_snapshot`'s: a process killed mid-write leaves the previous checkpoint whole.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        #: seconds the writes took on the thread, and how many were written, per kind
        #: (``checkpoint``, ``model``)
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @property
    def write_seconds(self) -> float:
        """Seconds the checkpoint writes took on the thread."""
        return self.seconds.get(CHECKPOINT_WRITE, 0.0)

    @property
    def writes(self) -> int:
        """How many checkpoints were written on the thread."""
        return self.counts.get(CHECKPOINT_WRITE, 0)

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self, path: Path, snapshot: Snapshot, done: Callable[[], object] | None = None
    ) -> None:
        """Write ``snapshot`` into ``path`` on a thread; ``done()`` runs on that thread after
        the file is published."""
        self.run(lambda: write_snapshot(path, snapshot), CHECKPOINT_WRITE, done)

    def run(
        self, write: Callable[[], object], kind: str, done: Callable[[], object] | None = None
    ) -> None:
        """Run ``write`` (which writes a host snapshot; ``kind`` names it in :attr:`seconds`
        and in the thread's name) on a thread, after the write in flight; ``done()`` runs on
        that thread after it."""
        self.wait()

        def work() -> None:
            start = time.perf_counter()
            try:
                write()
                if done is not None:
                    done()
            except BaseException as err:  # handed to the training thread by wait()
                self._error = err
            finally:
                self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - start
                self.counts[kind] = self.counts.get(kind, 0) + 1

        self._thread = threading.Thread(target=work, name=f"cselab-{kind}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise the error of a finished write, if any, without waiting."""
        if not self.busy:
            self.wait()

    def wait(self) -> None:
        """Block until no write is in flight; raise the last write's error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err


@contextlib.contextmanager
def _reading(file: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """``(safe_open(file), its cselab metadata)``. A file that cannot be read, is not safetensors
    or is not a checkpoint of this version (no cselab metadata, another format) is one
    :class:`ConfigError` naming it: it is met when resuming, and the way out is the user's."""

    def refuse(reason: str) -> ConfigError:
        return ConfigError(
            f"cannot resume from {file}: {reason}; remove it, or start the run again with "
            "--train.overwrite=true instead of --train.resume=true"
        )

    try:
        with safe_open(str(file), framework="pt") as fh:
            raw = (fh.metadata() or {}).get("cselab")
            if raw is None:
                raise refuse("not a cselab checkpoint (its metadata has no 'cselab' entry)")
            try:
                meta = json.loads(raw)
            except json.JSONDecodeError as err:
                raise refuse(f"its cselab metadata is not JSON ({err.msg})") from None
            version = meta.get("format") if isinstance(meta, dict) else None
            if version != FORMAT_VERSION:
                raise refuse(
                    f"checkpoint format {version}, this cselab reads format {FORMAT_VERSION}"
                )
            yield fh, meta
    except (OSError, SafetensorError) as err:
        raise refuse(f"unreadable ({_cause(err)})") from None


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of a checkpoint (step, config, ...) without reading its tensors; raises
    :class:`ConfigError` if ``path`` is not a checkpoint this version can resume."""
    with _reading(Path(path)) as (_, meta):
        return meta


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read tensors and metadata of ``path`` (a folder or the file itself); raises
    :class:`ConfigError` as :func:`read_metadata` does."""
    p = Path(path)
    file = p / RunFolder.CHECKPOINT_FILE if p.is_dir() else p
    with _reading(file) as (fh, meta):
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open API
    return tensors, meta


def restore(
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int = 0,
    device: torch.device | None = None,
) -> bool:
    """Load model, optimizer and scheduler states saved by :func:`write_snapshot`, and rank
    ``rank``'s RNG states (the CUDA one onto ``device``, the run's GPU). Returns ``False`` if the
    checkpoint holds no RNG record for ``rank`` (then the caller must seed that rank's RNGs
    itself)."""
    load_model_state(model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    # Optimizer.load_state_dict moves each state tensor to its parameter's device itself.
    optimizer.load_state_dict(_join_optimizer(tensors, meta["optimizer"]))
    # LambdaLR stores its functions as ``lr_lambdas`` (None for plain functions); they are rebuilt
    # from the config, so only the counters travel.
    scheduler.load_state_dict(
        {"lr_lambdas": [None] * len(optimizer.param_groups), **meta["scheduler"]}
    )
    record = rng_record(tensors, meta, rank)
    if record is not None:
        RNGState.from_record(record, device).restore()
    return record is not None


def publish_folder(tmp: Path, final: Path) -> None:
    """Publish the complete folder ``tmp`` as ``final`` so that one complete copy always exists
    (a kill at any point leaves either the old or the new folder, never a half-written one)."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def copy_model_folder(source: Path, folder: Path) -> Path:
    """Copy the saved model folder ``source`` as ``folder``, published atomically as
    :func:`save_model_folder` publishes (a failed copy keeps the previous ``folder``)."""
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    with publishing(folder, "model folder", tmp):
        # file by file: shutil.copytree would gather a full disk into a list of error strings
        tmp.mkdir()
        for src in sorted(source.rglob("*")):
            dst = tmp / src.relative_to(source)
            if src.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        publish_folder(tmp, folder)
    return folder


def save_model_folder(
    encoder: SentenceEncoder,
    config: Config,
    folder: Path,
    describe: Callable[[Path], object] | None = None,
) -> Path:
    """Save ``encoder`` (an HF and sentence-transformers folder) with the run's config as
    ``folder``, published atomically (:func:`publish_folder`); ``describe(tmp)`` writes more
    files (the model card) into the folder before it is published."""
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    with publishing(folder, "model folder", tmp):
        encoder.save(tmp)
        save_config(config, tmp / RunFolder.MODEL_CONFIG)
        if describe is not None:
            describe(tmp)
        publish_folder(tmp, folder)
    return folder


def snapshot_encoder(encoder: SentenceEncoder) -> SentenceEncoder:
    """A copy of ``encoder`` detached from training, for :func:`save_model_folder` on a
    thread: its trainable parameters and buffers copied to host memory (the optimiser changes
    them after the step; a GPU model's copy holds no GPU memory), its frozen parameters (LoRA's
    base model) shared, as no step changes them, and everything else (the tokenizer, whose fast
    tokenizer may not be used by two threads at once, the configs) deep-copied. Weights tied in
    the encoder are tied in the copy."""
    memo: dict[int, Any] = {}
    for param in encoder.parameters():  # each tied weight once
        if not param.requires_grad:
            memo[id(param)] = param
        else:
            memo[id(param)] = torch.nn.Parameter(_host_copy(param), requires_grad=True)
    for buffer in encoder.buffers():
        memo.setdefault(id(buffer), _host_copy(buffer))
    return copy.deepcopy(encoder, memo)
