"""Evaluation tasks: everything :func:`cselab.evaluation.evaluate` can run, behind one interface.

A task states the SentEval files it needs (fetched once, before any model is loaded), how much
work it is (the weight of its progress step), the headline table it fills, and how it runs on an
encoder; it returns a :class:`TaskResult`, whose entries go under ``results`` in the evaluation's
JSON. The SentEval tasks share one encoding cache (each distinct sentence encoded once); a
transfer task keeps its own (they share no sentences, and SST-2 alone is 70k); retrieval runs on
the encoder itself, once, with its Matryoshka dimensions (``whole_encoder``).

:data:`TASK_KINDS` is the registry: the CLI, sweeps and the library build task lists from it
(:func:`senteval_tasks` turns ``--tasks`` names and ``--sts-file`` pairs into tasks). A new task
is a class here with these attributes and one line in :data:`TASK_KINDS` (``docs/design.md``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..model.choices import BATCH_SIZE
from . import alignment, custom, sts, transfer
from .datasets import TASK_FILES, ScoredPairs
from .embed import EmbeddingCache, EncoderLike
from .names import ALIGN_UNIFORM, RETRIEVAL_K, RETRIEVAL_KIND, STS_FILE_KIND, TRANSFER_TASKS


@dataclass(frozen=True)
class TaskRun:
    """What a task is run with.

    Attributes:
        cache: the shared encoding cache of the SentEval tasks (every distinct sentence once).
        encoder: the encoder itself (a task that encodes its own way, or keeps its own cache).
        root: the SentEval ``data/downstream`` folder (``None`` when no task needs it).
        mode: ``test``, ``fasttest`` or ``dev``.
        batch_size: the encoding batch size.
        transfer_config: the transfer classifier, overriding the mode's.
        taken: the result names already used by earlier tasks of the same evaluation.
    """

    cache: EmbeddingCache
    encoder: EncoderLike
    root: Path | None
    mode: str
    batch_size: int = BATCH_SIZE
    transfer_config: transfer.ClassifierConfig | None = None
    taken: frozenset[str] = frozenset()

    @property
    def split(self) -> str:
        """The STS split of the mode."""
        return "dev" if self.mode == "dev" else "test"


@dataclass
class TaskResult:
    """A task's entries under ``results`` (``{name: result}``), the key of its time in
    ``timing``, and its own cache (``None``: the shared one), whose encoding counts are added to
    the evaluation's."""

    entries: dict[str, dict[str, Any]]
    timing_key: str
    cache: EmbeddingCache | None = None


@runtime_checkable
class EvalTask(Protocol):
    """One evaluation task (see the module docstring)."""

    #: the key of :data:`TASK_KINDS`
    kind: ClassVar[str]
    #: the ``headline`` table it fills (``sts``, ``sts_files``, ``transfer``) or ``None``
    headline: ClassVar[str | None]
    #: runs once on the encoder (not per Matryoshka dimension, not on the shared cache)
    whole_encoder: ClassVar[bool]

    @property
    def label(self) -> str:
        """The task in progress lines."""
        ...

    @property
    def senteval_names(self) -> tuple[str, ...]:
        """The SentEval tasks whose files it reads (fetched before the model is loaded)."""
        ...

    def weight(self, root: Path | None) -> float:
        """The size of its work, for the time-left estimate."""
        ...

    def run(self, run: TaskRun) -> TaskResult:
        """Evaluate."""
        ...


def files_size(root: os.PathLike[str] | str | None, names: Sequence[str]) -> float:
    """Bytes of the SentEval tasks' files (the weight of a progress step)."""
    total = 0
    if root is None:
        return 0.0
    for task in names:
        for name in TASK_FILES.get(task, ()):
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # a task reading fewer files than listed still weighs something
                continue
    return float(total)


@dataclass(frozen=True)
class STSTask:
    """STS12-16, STS-B and SICK-R (SentEval's protocol): Spearman of cosine vs gold, one
    encoding of every distinct sentence for all of them."""

    names: tuple[str, ...]
    kind: ClassVar[str] = "sts"
    headline: ClassVar[str | None] = "sts"
    whole_encoder: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return ", ".join(self.names)

    @property
    def senteval_names(self) -> tuple[str, ...]:
        return self.names

    def weight(self, root: Path | None) -> float:
        return files_size(root, self.names)

    def run(self, run: TaskRun) -> TaskResult:
        assert run.root is not None
        return TaskResult(sts.evaluate_sts(run.cache, list(self.names), run.split, run.root), "sts")


@dataclass(frozen=True)
class AlignUniformTask:
    """Alignment and uniformity (Wang & Isola 2020) on STS-B dev, as SimCSE's Fig. 2."""

    kind: ClassVar[str] = "align-uniform"
    headline: ClassVar[str | None] = None
    whole_encoder: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return ALIGN_UNIFORM

    @property
    def senteval_names(self) -> tuple[str, ...]:
        return (ALIGN_UNIFORM,)

    def weight(self, root: Path | None) -> float:
        return files_size(root, (ALIGN_UNIFORM,))

    def run(self, run: TaskRun) -> TaskResult:
        result = alignment.align_uniform(run.cache, run.root)
        return TaskResult({ALIGN_UNIFORM: result}, ALIGN_UNIFORM)


@dataclass(frozen=True)
class STSFileTask:
    """A user's own STS-format pairs (:mod:`cselab.evaluation.custom`), scored like STS-B and
    reported under the file's name (with its path when two files share a name)."""

    pairs: ScoredPairs
    kind: ClassVar[str] = STS_FILE_KIND
    headline: ClassVar[str | None] = "sts_files"
    whole_encoder: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return str(self.pairs.path)

    @property
    def senteval_names(self) -> tuple[str, ...]:
        return ()

    def weight(self, root: Path | None) -> float:
        return float(sum(map(len, self.pairs.sent1 + self.pairs.sent2)))

    def run(self, run: TaskRun) -> TaskResult:
        p = self.pairs
        name = p.name if p.name not in run.taken else f"{p.name} ({p.path})"
        return TaskResult({name: custom.evaluate_pairs(run.cache, p)}, name)


@dataclass(frozen=True)
class TransferTask:
    """One SentEval transfer task (a classifier on frozen vectors), with its own cache."""

    name: str
    kind: ClassVar[str] = "transfer"
    headline: ClassVar[str | None] = "transfer"
    whole_encoder: ClassVar[bool] = False

    @property
    def label(self) -> str:
        return self.name

    @property
    def senteval_names(self) -> tuple[str, ...]:
        return (self.name,)

    def weight(self, root: Path | None) -> float:
        return files_size(root, (self.name,))

    def run(self, run: TaskRun) -> TaskResult:
        cache = EmbeddingCache(run.encoder, run.batch_size)
        assert run.root is not None
        result = transfer.evaluate_transfer_task(
            cache, self.name, run.root, run.mode, run.transfer_config
        )
        return TaskResult({self.name: result}, self.name, cache)


@dataclass(frozen=True)
class RetrievalTask:
    """Retrieval on one split of a BEIR folder (:mod:`cselab.evaluation.retrieval`), with its
    Matryoshka ``dims`` from one encoding, exact or FAISS search; the entry is
    ``retrieval:<folder name>``."""

    collection: Any  # a BeirCollection, or the folder
    split: str = "test"
    k: int = RETRIEVAL_K
    dims: tuple[int, ...] | None = None
    backend: str = "exact"
    #: the top-k search (``None``: exact); the search layer's FAISS search is handed in by the
    #: caller (``cselab.search.index.vector_search``), since evaluation sits below it
    search: Any = field(default=None, compare=False)
    #: the query and document prompts (``None``: the model's saved ``query`` / ``document``)
    query_prompt: str | None = None
    document_prompt: str | None = None
    kind: ClassVar[str] = RETRIEVAL_KIND
    headline: ClassVar[str | None] = None
    whole_encoder: ClassVar[bool] = True

    @property
    def folder(self) -> Path:
        c = self.collection
        return Path(c.folder if hasattr(c, "folder") else c)

    @property
    def label(self) -> str:
        return f"retrieval {self.folder.name}"

    @property
    def senteval_names(self) -> tuple[str, ...]:
        return ()

    def weight(self, root: Path | None) -> float:
        return 0.0

    def run(self, run: TaskRun) -> TaskResult:
        from .retrieval import evaluate_retrieval

        result = evaluate_retrieval(
            run.encoder, self.collection, split=self.split, k=self.k,
            dims=list(self.dims) if self.dims else None, search=self.search,
            backend=self.backend, batch_size=run.batch_size,
            query_prompt=self.query_prompt, document_prompt=self.document_prompt,
        )  # fmt: skip
        name = f"retrieval:{self.folder.name}"
        return TaskResult({name: result}, name)


@dataclass(frozen=True)
class MTEBTask:
    """MTEB tasks through ``mteb.evaluate`` (:func:`cselab.evaluation.mteb.run_mteb`; needs
    ``cselab[mteb]``), once on the encoder: the entry ``mteb`` holds ``scores`` (each task's
    main score x 100 per split and subset) and MTEB's full ``results``. ``cselab evaluate
    --mteb`` prints and saves the same run its own way."""

    tasks: tuple[Any, ...]  # MTEB task names, or task objects (SentEvalSTSBenchmark)
    split: str | None = None
    output_folder: str | None = None
    kind: ClassVar[str] = "mteb"
    headline: ClassVar[str | None] = None
    whole_encoder: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return "MTEB " + ", ".join(
            t if isinstance(t, str) else type(t).__name__ for t in self.tasks
        )

    @property
    def senteval_names(self) -> tuple[str, ...]:
        return ()

    def weight(self, root: Path | None) -> float:
        return 0.0

    def run(self, run: TaskRun) -> TaskResult:
        from .mteb import run_mteb  # lazily: mteb is an optional dependency

        out = run_mteb(
            run.encoder, list(self.tasks), batch_size=run.batch_size,
            output_folder=self.output_folder, data_dir=run.root, split=self.split,
        )  # fmt: skip
        return TaskResult({"mteb": {"kind": self.kind, **out}}, "mteb")


#: The registry: every kind of task ``evaluate`` runs, by its ``kind``. ``cselab evaluate
#: --mteb`` keeps its own route (MTEB's progress, tables and result folder); the library runs
#: the same tasks as an :class:`MTEBTask`.
TASK_KINDS: dict[str, type] = {
    t.kind: t
    for t in (STSTask, AlignUniformTask, STSFileTask, TransferTask, RetrievalTask, MTEBTask)
}


def senteval_tasks(names: Sequence[str], files: Sequence[ScoredPairs] = ()) -> list[EvalTask]:
    """The tasks of SentEval task names (as :func:`~cselab.evaluation.api.parse_tasks` gives
    them) and STS files, in the order they run: STS, alignment/uniformity, the files, transfer."""
    tasks: list[EvalTask] = []
    sts_names = tuple(t for t in names if t in sts.STS_TASKS)
    if sts_names:
        tasks.append(STSTask(sts_names))
    if ALIGN_UNIFORM in names:
        tasks.append(AlignUniformTask())
    tasks += [STSFileTask(p) for p in files]
    tasks += [TransferTask(t) for t in names if t in TRANSFER_TASKS]
    return tasks
