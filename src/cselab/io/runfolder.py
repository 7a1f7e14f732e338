"""The run folder: the one place that names the files a training run (or a sweep cell) keeps,
and the lock that gives the folder one owner for the life of a run.

Everything that reads or writes a run folder asks :class:`RunFolder` for the path
(``RunFolder(out).metrics``), never spells a file name itself: the trainer, the checkpoint, the
model card, ``cselab plot``, ``cselab sweep`` and ``cselab report``.

The lock (:meth:`RunFolder.lock`) is an exclusive ``flock`` on ``.cselab.lock`` inside the
folder. The operating system releases it when the process ends, however it ends (an exception,
SIGKILL, a crash), so a stale lock file never blocks a later run; a second process that tries
while the first runs gets :class:`~cselab.core.errors.RunFolderBusy` at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import RunFolderBusy, WriteError
from .files import refuse_file_in_the_way


@dataclass(frozen=True)
class RunFolder:
    """The files of one run's output folder (``train.output_dir``, or a sweep cell)."""

    path: Path

    CONFIG = "config.yaml"
    #: What the run resolved once at its entry (``cselab.config.plan.RunPlan``): the data
    #: kind, dev set, device, precision, pooler, objective. One of :attr:`RUN_FILES`, so that
    #: ``train.overwrite`` removes it with the rest of the previous run: a new run that stops
    #: before writing its own leaves no stale plan for a card to read.
    PLAN = "plan.json"
    METRICS = "metrics.csv"
    RESULTS = "results.json"
    CHECKPOINT = "checkpoint"
    #: The checkpoint's weights and state inside :attr:`CHECKPOINT`.
    CHECKPOINT_FILE = "checkpoint.safetensors"
    BEST = "best"
    LAST = "last"
    #: ``best`` with its LoRA adapters merged into the weights (``train.save_merged``)
    MERGED = "merged"
    TENSORBOARD = "tensorboard"
    #: The run's config inside each saved model folder (:attr:`BEST`, :attr:`LAST`).
    MODEL_CONFIG = "cselab_config.yaml"
    #: A sweep cell's settings (config name, seed, overrides) and its final evaluation.
    CELL = "cell.json"
    EVALUATION = "eval.json"
    #: A sweep cell's resolved config (what its ``cselab train`` process reads) and its log.
    CELL_CONFIG = "sweep_config.yaml"
    CELL_LOG = "sweep.log"
    LOCK = ".cselab.lock"
    #: Held by ``cselab sweep`` for the life of a cell (its train and evaluate processes), so
    #: that a second sweep leaves a live cell alone; the train process holds :attr:`LOCK`.
    SWEEP_LOCK = ".cselab-sweep.lock"

    #: What a previous run leaves in its folder (the lock file is not part of a run).
    RUN_FILES = (CHECKPOINT, BEST, LAST, MERGED, CONFIG, PLAN, METRICS, RESULTS, TENSORBOARD)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def plan(self) -> Path:
        return self.path / self.PLAN

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def results(self) -> Path:
        return self.path / self.RESULTS

    @property
    def checkpoint(self) -> Path:
        return self.path / self.CHECKPOINT

    @property
    def checkpoint_file(self) -> Path:
        return self.path / self.CHECKPOINT / self.CHECKPOINT_FILE

    @property
    def best(self) -> Path:
        return self.path / self.BEST

    @property
    def last(self) -> Path:
        return self.path / self.LAST

    @property
    def merged(self) -> Path:
        return self.path / self.MERGED

    @property
    def tensorboard(self) -> Path:
        return self.path / self.TENSORBOARD

    @property
    def cell(self) -> Path:
        return self.path / self.CELL

    @property
    def evaluation(self) -> Path:
        return self.path / self.EVALUATION

    @property
    def cell_config(self) -> Path:
        return self.path / self.CELL_CONFIG

    @property
    def cell_log(self) -> Path:
        return self.path / self.CELL_LOG

    def model(self, name: str) -> Path:
        """The saved model folder ``best`` or ``last``."""
        if name not in (self.BEST, self.LAST):
            raise ValueError(f"a run folder keeps the models 'best' and 'last', not {name!r}")
        return self.path / name

    def saved_models(self) -> list[Path]:
        """The model folders this run folder holds, the one to use first: ``merged``
        (adapters folded in), ``best``, ``last``; empty for a folder that is no run's (every
        run writes its :attr:`CONFIG`; a model folder holds neither it nor these folders)."""
        if not self.config.is_file():
            return []
        return [p for p in (self.merged, self.best, self.last) if p.is_dir()]

    def previous_run(self) -> list[str]:
        """The run files present in the folder."""
        return [name for name in self.RUN_FILES if (self.path / name).exists()]

    @contextlib.contextmanager
    def lock(self, name: str = LOCK) -> Iterator[None]:
        """Hold the folder exclusively while the block runs (creates the folder); ``name`` is
        the lock file (:attr:`LOCK`, or :attr:`SWEEP_LOCK` for a sweep's cell).

        Raises :class:`RunFolderBusy` naming the folder when another process holds it. A folder
        this call created and the block left empty is removed again, so a run refused before it
        wrote anything (a bad setting) leaves nothing behind.
        """
        created = not self.path.exists()
        fd = self._acquire(name)
        try:
            with contextlib.suppress(OSError):  # the pid is for people; a full disk may refuse it
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
            try:
                yield
            finally:
                if created:
                    self._remove_if_empty(name)
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _remove_if_empty(self, name: str) -> None:
        """Remove the folder if it holds only the lock file (called with the lock held: a
        process that opened the lock file meanwhile finds it gone once it gets the lock, and
        starts over, see :meth:`_acquire`)."""
        with contextlib.suppress(OSError):  # something else appeared, or is not ours to remove
            if [p.name for p in self.path.iterdir()] == [name]:
                (self.path / name).unlink()
                self.path.rmdir()

    def _acquire(self, name: str) -> int:
        """An open descriptor of the lock file, exclusively locked."""
        refuse_file_in_the_way(self.path)
        while True:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the previous holder removed the empty folder meanwhile
                continue
            except OSError as err:  # read-only, no permission, disk full: before any work
                raise WriteError(
                    f"{self.path}: cannot write there ({err.strerror or err}); choose a folder "
                    "this process can write in"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunFolderBusy(
                    f"{self.path} is in use by another cselab process (it holds "
                    f"{self.path / name}); wait for it to finish or choose another folder"
                ) from None
            try:
                current = os.stat(self.path / name).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                return fd
            os.close(fd)  # the previous holder removed the file it locked: lock the new one


@contextlib.contextmanager
def work_folder(base: Path, prefix: str) -> Iterator[Path]:
    """A new hidden working folder ``base/PREFIX<random>``, held with :meth:`RunFolder.lock`
    while the block runs and removed at its end (what the block moved out of it, a finished
    result, stays where it was moved).

    Working folders of the same ``prefix`` in ``base`` that no process holds any more are
    removed first: a process ended by SIGKILL or a power cut cannot clean up, and its lock is
    free once it is gone, so a later run removes what it left (a live run's folder is held and
    stays). The one home of this rule: ``cselab mine``'s index, ``cselab merge``'s folder, the
    token cache's entry being written.
    """
    refuse_file_in_the_way(base)  # names the user's folder, not the working folder's name
    for old in base.glob(prefix + "*"):
        if not old.is_dir() or old.is_symlink():
            continue
        try:
            with RunFolder(old).lock():
                shutil.rmtree(old, ignore_errors=True)
        except (RunFolderBusy, OSError):
            continue  # a live run's folder, or not ours to remove
    while True:
        folder = base / f"{prefix}{uuid.uuid4().hex[:12]}"
        held = contextlib.ExitStack()
        try:
            held.enter_context(RunFolder(folder).lock())
        except RunFolderBusy:
            continue  # another run's clean-up took it the instant it was made: another name
        with held:
            try:
                yield folder
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        return
