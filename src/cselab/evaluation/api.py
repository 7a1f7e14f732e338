"""``evaluate(encoder, tasks, mode, data_dir)``: the whole suite, one results dict."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigSettingError
from ..core.schema import ConfigError
from ..model.choices import BATCH_SIZE
from . import custom, transfer
from .datasets import ScoredPairs
from .download import ensure_data
from .embed import EmbeddingCache, EncoderLike, at_dimension
from .names import ALIGN_UNIFORM, MODES, STS_FILE_KIND  # noqa: F401 - re-exported by the package
from .registry import TASK_KINDS, senteval_tasks
from .report import headline
from .tasks import EvalTask, TaskRun

log = logging.getLogger(__name__)


def _spellings() -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """The ``--tasks`` groups (each kind's ``group``, then ``all``: every group's names, then
    the names in no group) and every other spelling of a task name, from the registry."""
    groups = {k.group: k.task_names for k in TASK_KINDS.values() if k.group}
    ungrouped = [n for k in TASK_KINDS.values() if not k.group for n in k.task_names]
    groups["all"] = (*(n for names in groups.values() for n in names), *ungrouped)
    aliases = {n.lower(): n for k in TASK_KINDS.values() for n in k.task_names}
    for kind in TASK_KINDS.values():
        aliases.update(kind.aliases)
    return groups, aliases


#: ``--tasks`` groups: ``sts``, ``transfer``, ``all``
TASK_GROUPS, _ALIASES = _spellings()
#: the names with no dev split (refused in mode ``dev``, left out of the groups there)
_TEST_ONLY = frozenset(n for k in TASK_KINDS.values() for n in k.test_only)
#: the kinds run on the user's own data, by their name as ``--tasks`` would spell it
_OWN_DATA = {k.kind.replace("-", ""): k for k in TASK_KINDS.values() if k.data_hint}


def parse_tasks(
    spec: str | Iterable[str], mode: str = "test", given: Collection[str] = ()
) -> list[str]:
    """``"sts"``, ``"transfer"``, ``"all"`` or names (``"STS12,STS-B,sick-r"``) -> task names,
    as the task kinds of :data:`~cselab.evaluation.registry.TASK_KINDS` spell them.

    In ``dev`` mode STS12-16 are left out of the groups (they have no dev split) and are an
    error when named. The kind of a task run on the user's own data (``clustering``) names no
    benchmark: left out when its data is ``given`` (kinds), else an error naming the option
    that gives the data.
    """
    items = [s for s in (spec.split(",") if isinstance(spec, str) else spec)]
    out: list[str] = []
    skipped = False
    for item in (i.strip() for i in items):
        if not item:
            continue
        key = item.lower().replace("-", "").replace("_", "").replace(" ", "")
        if key in TASK_GROUPS:
            names = TASK_GROUPS[key]
            if mode == "dev":
                names = tuple(n for n in names if n not in _TEST_ONLY)
        elif key in _ALIASES:
            names = (_ALIASES[key],)
            if mode == "dev" and names[0] in _TEST_ONLY:
                raise ConfigSettingError(
                    "mode", "test", "{task} has no dev split; use {setting}",
                    values=("test", "fasttest"), task=names[0],
                )  # fmt: skip
        elif key in _OWN_DATA:
            kind = _OWN_DATA[key]
            if kind.kind not in given:
                raise ConfigError(
                    f"task {item!r} runs on your own data, not a benchmark: {kind.data_hint}"
                )
            skipped = True
            continue
        else:
            known = ", ".join([*TASK_GROUPS, *TASK_GROUPS["all"]])
            raise ConfigError(f"unknown task {item!r}; expected one of {known}")
        out.extend(n for n in names if n not in out)
    if not out and not skipped:
        raise ConfigError("no task to evaluate")
    return out


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: a time for a progress line."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class TaskProgress:
    """One log line as each step of an evaluation starts and one as it ends, with the time left.

    The time left is the time so far scaled by the size of the data still to go: each step's
    weight is the size of its files (encoding, the bulk of the time, grows with the text), so
    the estimate is rough (a transfer task also trains classifiers) and is labelled "about".
    """

    def __init__(self, steps: Sequence[tuple[str, float]]) -> None:
        self.steps = list(steps)
        self.total = sum(w for _, w in self.steps) or 1.0
        self.done = 0.0
        self.index = 0
        self.started = time.perf_counter()
        self.step_started = self.started

    def start(self) -> None:
        label, _ = self.steps[self.index]
        self.step_started = time.perf_counter()
        log.info("evaluate [%d/%d] %s ...", self.index + 1, len(self.steps), label)

    def end(self) -> None:
        label, weight = self.steps[self.index]
        self.index += 1
        self.done += weight
        now = time.perf_counter()
        elapsed = now - self.started
        left = ""
        if self.index < len(self.steps) and self.done > 0:
            left = f", about {_duration(elapsed * (self.total - self.done) / self.done)} left"
        log.info(
            "evaluate [%d/%d] %s done in %s (%s elapsed%s)",
            self.index, len(self.steps), label, _duration(now - self.step_started),
            _duration(elapsed), left,
        )  # fmt: skip


def evaluate(
    encoder: EncoderLike,
    tasks: str | Iterable[str | EvalTask] | None = "sts",
    mode: str = "test",
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int = BATCH_SIZE,
    download: bool = True,
    transfer_config: transfer.ClassifierConfig | None = None,
    model_name: str | None = None,
    sts_files: Sequence[str | os.PathLike[str] | ScoredPairs] = (),
    sts_columns: Sequence[str] | None = None,
    dims: Sequence[int] | None = None,
) -> dict:
    """Evaluate ``encoder`` on SentEval tasks the way SentEval + SimCSE's ``evaluation.py`` do.

    Args:
        encoder: ``encode(list[str], batch_size=...) -> (N, D)`` object (e.g. a
            ``cselab`` ``SentenceEncoder``) or a callable ``list[str] -> (N, D)``.
        tasks: ``"sts"`` (STS12-16, STS-B, SICK-R), ``"transfer"`` (MR CR SUBJ MPQA SST2 TREC
            MRPC), ``"all"`` (both + alignment/uniformity), or task names.
        mode: ``test`` (test splits; full SentEval classifier), ``fasttest`` (test splits; fast
            classifier) or ``dev`` (STS-B dev, SICK trial, transfer dev accuracy; fast classifier).
        data_dir: SentEval ``data/downstream`` folder; default ``$CSELAB_DATA`` or the cache.
        download: fetch missing files into the cache folder.
        transfer_config: override the mode's classifier setting.
        model_name: recorded in the results (default: the encoder's ``source``, if any).
        sts_files: your own STS-format pair files (or already read pairs), each scored like
            STS-B and reported under its file name (:mod:`cselab.evaluation.custom`); with
            ``tasks=None`` only these are evaluated.
        sts_columns: the sentence 1, sentence 2 and score column names of ``sts_files``.
        dims: also evaluate the SentEval tasks at these Matryoshka dimensions (the first ``d``
            coordinates, re-normalised), every distinct sentence encoded once for all of them:
            ``out["dims"]["64"]`` holds that dimension's ``results`` and ``headline``.

    ``tasks`` may also hold :class:`~cselab.evaluation.tasks.EvalTask` objects (a
    :class:`~cselab.evaluation.tasks.RetrievalTask` on a BEIR folder, an
    :class:`~cselab.evaluation.tasks.MTEBTask`, ...): they run after the named ones; a task with
    ``whole_encoder`` runs once on ``encoder`` (retrieval: with its own ``dims``), the others at
    each dimension. This is everything ``cselab evaluate`` runs.

    Returns:
        ``{"model", "pooler", "mode", "tasks", "data_dir", "date", "results": {task: ...},
        "headline", "timing", "encoding"}``. Correlations are in [-1, 1] (as SentEval),
        accuracies in %; ``headline`` has the paper tables (x 100, two decimals).
    """
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if isinstance(encoder, str | os.PathLike):  # str has an encode() of its own
        raise ConfigError(
            f"evaluate() takes a loaded model, not the path {os.fspath(encoder)!r}: pass "
            "cselab.load(path)"
        )
    if isinstance(sts_files, str | os.PathLike | ScoredPairs):  # one file, not its characters
        sts_files = [sts_files]
    if isinstance(dims, int):  # one dimension, as one file above ("int is not iterable")
        dims = [dims]
    given = [] if tasks is None or isinstance(tasks, str) else list(tasks)
    objects = [t for t in given if isinstance(t, EvalTask)]
    named = [n for t in given if isinstance(t, str) for n in t.split(",")]  # "sts,MR" too
    files = [
        f if isinstance(f, ScoredPairs) else custom.read_sts_file(f, sts_columns) for f in sts_files
    ]
    if isinstance(tasks, str) or named:
        kinds = {t.kind for t in objects} | ({STS_FILE_KIND} if files else set())
        names = parse_tasks(tasks if isinstance(tasks, str) else named, mode, kinds)
    elif files or objects:
        names = []
    else:
        names = parse_tasks(given, mode)  # nothing to evaluate: the one error for it
    plan = [*senteval_tasks(names, files), *objects]
    per_dim = [t for t in plan if not t.whole_encoder]
    whole = [t for t in plan if t.whole_encoder]
    # the SentEval tasks in the order named (``tasks`` in the JSON), then the objects' own
    needed = list(dict.fromkeys([*names, *(n for t in per_dim for n in t.senteval_names)]))
    root = ensure_data(needed, data_dir, download_missing=download) if needed else None
    if per_dim or not whole:
        run = _Run(mode, root, batch_size, transfer_config)
        if not dims:
            out = run(encoder, per_dim, model_name)
        else:  # every distinct sentence encoded once for all the dimensions
            cache = EmbeddingCache(encoder, batch_size)
            out = run(cache.embed, per_dim, model_name or getattr(encoder, "source", None))
            out["pooler"] = _pooler(encoder)
            out["dims"] = {}
            for dim in dims:
                at = run(at_dimension(cache.embed, dim), per_dim, model_name)
                out["dims"][str(dim)] = {"results": at["results"], "headline": at["headline"]}
        out["tasks"] = needed
    else:  # retrieval alone: no SentEval table
        out = {
            "model": model_name or getattr(encoder, "source", None),
            "pooler": _pooler(encoder),
            "mode": getattr(whole[0], "split", mode),
            "tasks": [],
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "results": {},
        }
    for task in whole:
        folder = root if root is not None else (Path(data_dir) if data_dir else None)
        run_on = TaskRun(EmbeddingCache(encoder, batch_size), encoder, folder, mode, batch_size)
        out["results"].update(task.run(run_on).entries)
    return out


def _pooler(encoder: object) -> str | None:
    pooler = getattr(getattr(encoder, "pooler", None), "kind", None)  # a cselab SentenceEncoder
    return pooler if isinstance(pooler, str) else None


@dataclass(frozen=True)
class _Run:
    """One pass of the tasks that share an encoding cache over one encoder (or one
    Matryoshka view of it): the results dict with its timing, encoding counts and headline."""

    mode: str
    root: Path | None
    batch_size: int
    transfer_config: transfer.ClassifierConfig | None

    def __call__(
        self, encoder: EncoderLike, tasks: Sequence[EvalTask], model_name: str | None
    ) -> dict:
        started = time.perf_counter()
        results: dict[str, dict] = {}
        timing: dict[str, float] = {}
        shared = EmbeddingCache(encoder, self.batch_size)
        progress = TaskProgress([(t.label, t.weight(self.root)) for t in tasks])
        encodings = {"distinct": 0, "requested": 0}
        encode_s = 0.0
        own: list[EmbeddingCache] = []
        for task in tasks:
            progress.start()
            t0, before = time.perf_counter(), shared.encoded
            run = TaskRun(
                shared, encoder, self.root, self.mode, self.batch_size, self.transfer_config,
                frozenset(results),
            )  # fmt: skip
            result = task.run(run)
            results.update(result.entries)
            timing[result.timing_key] = time.perf_counter() - t0
            if shared.encoded > before:  # what this task added to the shared cache
                log.info(
                    "%s (%s): %d distinct sentences encoded in %.1fs",
                    task.kind, task.label, shared.encoded - before, timing[result.timing_key],
                )  # fmt: skip
            if result.cache is not None:
                own.append(result.cache)
            progress.end()
        # the shared cache first, then each task's own (the order the counts were summed in)
        for cache in (shared, *own):
            encodings["distinct"] += cache.encoded
            encodings["requested"] += cache.requested
            encode_s += cache.encode_seconds
        timing["encode"] = encode_s
        timing["total"] = time.perf_counter() - started
        out = {
            "model": model_name or getattr(encoder, "source", None),
            "pooler": _pooler(encoder),
            "mode": self.mode,
            "tasks": [],
            "data_dir": str(self.root) if self.root is not None else None,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "results": results,
            "timing": timing,
            "encoding": encodings,
        }
        out["headline"] = headline(out)
        return out
