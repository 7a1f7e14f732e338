"""Evaluation tasks: everything :func:`cselab.evaluation.evaluate` can run, behind one interface.

A task states the SentEval files it needs (fetched once, before any model is loaded), how much
work it is (the weight of its progress step), and how it runs on an encoder; it returns a
:class:`TaskResult`, whose entries go under ``results`` in the evaluation's JSON. The SentEval
tasks share one encoding cache (each distinct sentence encoded once); a transfer task keeps its
own (they share no sentences, and SST-2 alone is 70k); retrieval runs on the encoder itself,
once, with its Matryoshka dimensions (``whole_encoder``).

Its kind (a :class:`TaskKind`, the class) also declares what is shown of its results: the
names ``--tasks`` and ``evaluate(tasks=...)`` know it by (:func:`cselab.evaluation.api.
parse_tasks`), its headline row, title and Hub ``model-index`` results, and any markdown of
its own. The task lists, the report, the model card and the Hub metadata iterate over the
registry of kinds (:data:`cselab.evaluation.registry.TASK_KINDS`), so a new task is its module
(the class and its algorithm, as :mod:`cselab.evaluation.clustering`), one line in the registry
and its option in ``cselab evaluate`` (``docs/design.md``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..core.metrics import RETRIEVAL_NAMES, STSB, retrieval_metric
from ..model.choices import BATCH_SIZE
from . import alignment, custom, sts, transfer
from .datasets import STS_YEARS, TASK_FILES, ScoredPairs
from .embed import EmbeddingCache, EncoderLike
from .names import (
    ALIGN_UNIFORM,
    RETRIEVAL_HINT,
    RETRIEVAL_K,
    RETRIEVAL_KIND,
    STS_FILE_HINT,
    STS_FILE_KIND,
    TRANSFER_COLUMNS,
    TRANSFER_TASKS,
    senteval_hub_dataset,
)
from .table import cell, markdown_table, r2, with_avg

#: STS12-16, STS-B and SICK-R as SimCSE's tables show them: ``(task name, column label)``
STS_COLUMNS = (
    *((year, year) for year in STS_YEARS),
    ("STSBenchmark", "STS-B"),
    ("SICKRelatedness", "SICK-R"),
)
#: a headline table: ``{column: value x 100 (two decimals) or None}``
Row = dict[str, float | None]


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

    #: the key of the registry (:data:`~cselab.evaluation.registry.TASK_KINDS`)
    kind: ClassVar[str]
    #: the ``headline`` table it fills (``sts``, ``sts_files``, ``transfer``, ...) or ``None``
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


def hub_split(split: str) -> str:
    """A split as the Hub's ``model-index`` names it (``dev`` is ``validation``)."""
    return "validation" if split == "dev" else split


class TaskKind:
    """What a kind of task declares besides how it runs: the names it answers to, and what is
    shown of its results. Every hook reads a results dict (``evaluate``'s, or a JSON file of
    ``cselab evaluate -o``), so a report of old files needs no task object. The defaults: no
    name, no table, nothing of its own to show."""

    kind: ClassVar[str]
    #: the key of its table in ``headline`` (``None``: it fills none)
    headline: ClassVar[str | None] = None
    #: runs once on the encoder (not per Matryoshka dimension, not on the shared cache)
    whole_encoder: ClassVar[bool] = False
    #: the plot panel of its headline table (``cselab compare --plot``): title, y-axis label
    panel: ClassVar[tuple[str, str] | None] = None
    #: its table comes after the benchmarks' (its rows are the user's own data)
    own_data: ClassVar[bool] = False
    #: the task names it runs, as ``--tasks`` spells them (``all`` runs them too)
    task_names: ClassVar[tuple[str, ...]] = ()
    #: the ``--tasks`` name of all of them (``sts``), if any
    group: ClassVar[str | None] = None
    #: other spellings of its task names (lower case, without ``-``, ``_`` or spaces)
    aliases: ClassVar[Mapping[str, str]] = {}
    #: its task names that have no dev split (refused in mode ``dev``, left out of the groups)
    test_only: ClassVar[tuple[str, ...]] = ()
    #: a kind run on the user's own data: how to give that data (``--tasks`` naming the kind
    #: without it is told so; ``cselab evaluate`` shows its option instead)
    data_hint: ClassVar[str | None] = None

    @classmethod
    def requested(cls, names: Sequence[str], sts_files: Sequence[ScoredPairs]) -> list[EvalTask]:
        """Its tasks for parsed task ``names`` and a user's STS files, in the order they run."""
        return []

    @classmethod
    def headline_row(cls, results: Mapping[str, Any], dev: bool) -> Row | None:
        """Its ``headline`` table from an evaluation's ``results`` (``None``: not evaluated)."""
        return None

    @classmethod
    def title(cls, mode: str) -> str:
        """The title of its headline table."""
        return cls.kind

    @classmethod
    def extra_markdown(cls, names: Sequence[str], outs: Sequence[Mapping[str, Any]]) -> list[str]:
        """Markdown it adds after every headline table of a report (a row per run)."""
        return []

    @classmethod
    def entry_markdown(cls, out: Mapping[str, Any]) -> dict[str, str]:
        """Markdown of its own for result entries, by entry (printed after the report, and a
        part of its own in the model card)."""
        return {}

    @classmethod
    def hub_results(cls, out: Mapping[str, Any], table: Mapping[str, Row]) -> list[dict[str, Any]]:
        """Its results in the Hub's ``model-index``: keyword arguments of ``huggingface_hub``'s
        ``EvalResult`` (``table``: the evaluation's headline)."""
        return []


def _entries(out: Mapping[str, Any], kind: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The result entries of ``kind`` of an evaluation, in order."""
    return [(k, r) for k, r in out.get("results", {}).items()
            if isinstance(r, Mapping) and r.get("kind") == kind]  # fmt: skip


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
class STSTask(TaskKind):
    """STS12-16, STS-B and SICK-R (SentEval's protocol): Spearman of cosine vs gold, one
    encoding of every distinct sentence for all of them. Its headline row follows SimCSE's
    ``evaluation.py``: STS12-16's ``all`` Spearman, STS-B's and SICK-R's on the split."""

    names: tuple[str, ...]
    kind: ClassVar[str] = "sts"
    headline: ClassVar[str | None] = "sts"
    panel: ClassVar[tuple[str, str] | None] = ("STS", "Spearman x 100")
    task_names: ClassVar[tuple[str, ...]] = sts.STS_TASKS
    group: ClassVar[str | None] = "sts"
    aliases: ClassVar[Mapping[str, str]] = {
        STSB: "STSBenchmark",
        "sickr": "SICKRelatedness",
        "sick": "SICKRelatedness",
    }
    test_only: ClassVar[tuple[str, ...]] = sts.STS_YEARS

    @classmethod
    def requested(cls, names: Sequence[str], sts_files: Sequence[ScoredPairs]) -> list[EvalTask]:
        chosen = tuple(t for t in names if t in cls.task_names)
        return [cls(chosen)] if chosen else []

    @classmethod
    def headline_row(cls, results: Mapping[str, Any], dev: bool) -> Row | None:
        columns = [(t, label) for t, label in STS_COLUMNS if not (dev and t in STS_YEARS)]
        if not any(t in results for t, _ in columns):
            return None
        return with_avg(
            {label: _sts_value(t, results[t]) if t in results else None for t, label in columns}
        )

    @classmethod
    def title(cls, mode: str) -> str:
        return f"STS: Spearman x 100 ({mode}; STS12-16 'all' setting)"

    @classmethod
    def hub_results(cls, out: Mapping[str, Any], table: Mapping[str, Row]) -> list[dict[str, Any]]:
        return _senteval_hub_results(
            out, table.get("sts", {}), STS_COLUMNS, "sentence-similarity",
            "Semantic Textual Similarity", "spearman_cosine", "Spearman (cosine) x 100",
        )  # fmt: skip

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


def _sts_value(task: str, res: Mapping[str, Any]) -> float | None:
    value = res["all"]["spearman"] if task in STS_YEARS else res["spearman"]
    return r2(100.0 * value) if value is not None else None


def _senteval_hub_results(
    out: Mapping[str, Any], row: Row, columns: Sequence[tuple[str, str]], task_type: str,
    task_name: str, metric: str, metric_name: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """A SentEval table's Hub results: one per task with a value in its headline ``row``."""
    split = hub_split("dev" if out.get("mode", "test") == "dev" else "test")
    return [
        {
            "task_type": task_type,
            "task_name": task_name,
            "dataset_type": senteval_hub_dataset(task)[0],
            "dataset_name": senteval_hub_dataset(task)[1],
            "dataset_split": split,
            "metric_type": metric,
            "metric_name": metric_name,
            "metric_value": row[label],
        }  # fmt: skip
        for task, label in columns
        if row.get(label) is not None
    ]


@dataclass(frozen=True)
class AlignUniformTask(TaskKind):
    """Alignment and uniformity (Wang & Isola 2020) on STS-B dev, as SimCSE's Fig. 2."""

    kind: ClassVar[str] = "align-uniform"
    task_names: ClassVar[tuple[str, ...]] = (ALIGN_UNIFORM,)
    aliases: ClassVar[Mapping[str, str]] = {
        "align": ALIGN_UNIFORM,
        "alignment": ALIGN_UNIFORM,
        "uniformity": ALIGN_UNIFORM,
    }

    @classmethod
    def requested(cls, names: Sequence[str], sts_files: Sequence[ScoredPairs]) -> list[EvalTask]:
        return [cls()] if ALIGN_UNIFORM in names else []

    @classmethod
    def extra_markdown(cls, names: Sequence[str], outs: Sequence[Mapping[str, Any]]) -> list[str]:
        runs = [(n, o["results"][ALIGN_UNIFORM]) for n, o in zip(names, outs, strict=True)
                if ALIGN_UNIFORM in o.get("results", {})]  # fmt: skip
        if not runs:
            return []
        rows = [[n, f"{r['alignment']:.4f}", f"{r['uniformity']:.4f}"] for n, r in runs]
        return [
            "**Alignment / uniformity (STS-B dev, lower is better)**\n\n"
            + markdown_table(["Model", "alignment", "uniformity"], rows)
        ]

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
class STSFileTask(TaskKind):
    """A user's own STS-format pairs (:mod:`cselab.evaluation.custom`), scored like STS-B and
    reported under the file's name (with its path when two files share a name); its table has
    no "Avg" (the files are not a benchmark's columns)."""

    pairs: ScoredPairs
    kind: ClassVar[str] = STS_FILE_KIND
    headline: ClassVar[str | None] = "sts_files"
    panel: ClassVar[tuple[str, str] | None] = ("Your STS files", "Spearman x 100")
    own_data: ClassVar[bool] = True
    data_hint: ClassVar[str | None] = STS_FILE_HINT

    @classmethod
    def requested(cls, names: Sequence[str], sts_files: Sequence[ScoredPairs]) -> list[EvalTask]:
        return [cls(p) for p in sts_files]

    @classmethod
    def headline_row(cls, results: Mapping[str, Any], dev: bool) -> Row | None:
        return own_rows(results, cls.kind, "spearman") or None

    @classmethod
    def title(cls, mode: str) -> str:
        return "Your STS files: Spearman x 100 of cosine vs score"

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


def own_rows(results: Mapping[str, Any], kind: str, metric: str) -> Row:
    """``{entry: metric x 100}`` of every result entry of ``kind`` (a user's own files)."""
    return {t: r2(100.0 * r[metric]) for t, r in results.items() if r.get("kind") == kind}


@dataclass(frozen=True)
class TransferTask(TaskKind):
    """One SentEval transfer task (a classifier on frozen vectors), with its own cache; its
    headline is test accuracy (``devacc`` in ``dev`` mode), and MRPC's F1 follows the tables."""

    name: str
    kind: ClassVar[str] = "transfer"
    headline: ClassVar[str | None] = "transfer"
    panel: ClassVar[tuple[str, str] | None] = ("Transfer", "accuracy %")
    task_names: ClassVar[tuple[str, ...]] = TRANSFER_TASKS
    group: ClassVar[str | None] = "transfer"
    aliases: ClassVar[Mapping[str, str]] = {"sst": "SST2"}

    @classmethod
    def requested(cls, names: Sequence[str], sts_files: Sequence[ScoredPairs]) -> list[EvalTask]:
        return [cls(t) for t in names if t in cls.task_names]

    @classmethod
    def headline_row(cls, results: Mapping[str, Any], dev: bool) -> Row | None:
        if not any(t in results for t, _ in TRANSFER_COLUMNS):
            return None
        key = "devacc" if dev else "acc"
        return with_avg(
            {label: r2(results[t][key]) if t in results else None for t, label in TRANSFER_COLUMNS}
        )

    @classmethod
    def title(cls, mode: str) -> str:
        return f"Transfer: accuracy % ({mode})"

    @classmethod
    def extra_markdown(cls, names: Sequence[str], outs: Sequence[Mapping[str, Any]]) -> list[str]:
        f1 = [(n, o["results"]["MRPC"].get("f1")) for n, o in zip(names, outs, strict=True)
              if "MRPC" in o.get("results", {})]  # fmt: skip
        return ["MRPC F1: " + ", ".join(f"{n} {cell(v)}" for n, v in f1)] if f1 else []

    @classmethod
    def hub_results(cls, out: Mapping[str, Any], table: Mapping[str, Row]) -> list[dict[str, Any]]:
        return _senteval_hub_results(
            out, table.get("transfer", {}), TRANSFER_COLUMNS, "text-classification",
            "SentEval transfer (logistic regression)", "accuracy", "Accuracy x 100",
        )  # fmt: skip

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
class RetrievalTask(TaskKind):
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
    whole_encoder: ClassVar[bool] = True
    data_hint: ClassVar[str | None] = RETRIEVAL_HINT

    @classmethod
    def entry_markdown(cls, out: Mapping[str, Any]) -> dict[str, str]:
        from .retrieval import markdown

        return {k: markdown(dict(r)) for k, r in _entries(out, cls.kind)}

    @classmethod
    def extra_markdown(cls, names: Sequence[str], outs: Sequence[Mapping[str, Any]]) -> list[str]:
        """A table per collection and split (``cselab compare``), a row per run that has it,
        its measures (x 100, full width) as columns. One run's report shows its own
        (:meth:`entry_markdown`) instead."""
        if len(outs) < 2:
            return []
        tables: dict[tuple[str, str], list[tuple[str, Mapping[str, Any]]]] = {}
        for name, out in zip(names, outs, strict=True):
            for key, result in _entries(out, cls.kind):
                tables.setdefault((key, str(result.get("split", ""))), []).append((name, result))
        parts = []
        for (key, split), runs in tables.items():
            measures = list(dict.fromkeys(m for _, r in runs for m in r.get("metrics", {})))
            rows = [[n, *(cell(r.get("metrics", {}).get(m)) for m in measures)] for n, r in runs]
            parts.append(
                f"**Retrieval: {key.removeprefix(cls.kind + ':')} ({split}, x 100)**\n\n"
                + markdown_table(["Model", *measures], rows)
            )
        return parts

    @classmethod
    def hub_results(cls, out: Mapping[str, Any], table: Mapping[str, Row]) -> list[dict[str, Any]]:
        """One per measure (nDCG@k, MRR@k, Recall@..., MAP@100, x 100, full width), with
        MTEB's metric spelling (``ndcg_at_10``)."""
        results = []
        for _, result in _entries(out, cls.kind):
            name = Path(str(result["folder"])).name
            for metric, value in result["metrics"].items():
                if (measure := retrieval_metric(metric)) is None:
                    continue
                what, k = measure
                results.append({
                    "task_type": "retrieval", "task_name": "Retrieval", "dataset_type": name,
                    "dataset_name": f"{name} (BEIR folder, {result['documents']} documents)",
                    "dataset_split": hub_split(str(result["split"])),
                    "metric_type": f"{what}_at_{k}",
                    "metric_name": f"{RETRIEVAL_NAMES[what]}@{k} x 100",
                    "metric_value": round(float(value), 2),
                })  # fmt: skip
        return results

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
class MTEBTask(TaskKind):
    """MTEB tasks through ``mteb.evaluate`` (:func:`cselab.evaluation.mteb.run_mteb`; needs
    ``cselab[mteb]``), once on the encoder: the entry ``mteb`` holds ``scores`` (each task's
    main score x 100 per split and subset) and MTEB's full ``results``. ``cselab evaluate
    --mteb`` prints and saves the same run its own way."""

    tasks: tuple[Any, ...]  # MTEB task names, or task objects (SentEvalSTSBenchmark)
    split: str | None = None
    output_folder: str | None = None
    kind: ClassVar[str] = "mteb"
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
