"""``evaluate(encoder, tasks, mode, data_dir)``: the whole suite, one results dict."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
from collections.abc import Iterable, Sequence

from ..core.schema import ConfigError
from . import alignment, custom, sts, transfer
from .datasets import TASK_FILES, ScoredPairs
from .download import ensure_data
from .embed import EmbeddingCache, EncoderLike
from .names import MODES
from .report import headline

log = logging.getLogger(__name__)

ALIGN_UNIFORM = "AlignUniform"
TASK_GROUPS: dict[str, tuple[str, ...]] = {
    "sts": sts.STS_TASKS,
    "transfer": transfer.TRANSFER_TASKS,
    "all": (*sts.STS_TASKS, *transfer.TRANSFER_TASKS, ALIGN_UNIFORM),
}

_ALIASES = {
    **{t.lower(): t for t in TASK_FILES},
    "stsb": "STSBenchmark",
    "sickr": "SICKRelatedness",
    "sick": "SICKRelatedness",
    "sst": "SST2",
    "align": ALIGN_UNIFORM,
    "alignment": ALIGN_UNIFORM,
    "uniformity": ALIGN_UNIFORM,
}


def parse_tasks(spec: str | Iterable[str], mode: str = "test") -> list[str]:
    """``"sts"``, ``"transfer"``, ``"all"`` or names (``"STS12,STS-B,sick-r"``) -> task names.

    In ``dev`` mode STS12-16 are left out of the groups (they have no dev split) and are an
    error when named.
    """
    items = [s for s in (spec.split(",") if isinstance(spec, str) else spec)]
    out: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        key = item.lower().replace("-", "").replace("_", "").replace(" ", "")
        if key in TASK_GROUPS:
            names = TASK_GROUPS[key]
            if mode == "dev":
                names = tuple(n for n in names if n not in sts.STS_YEARS)
        elif key in _ALIASES:
            names = (_ALIASES[key],)
            if mode == "dev" and names[0] in sts.STS_YEARS:
                raise ConfigError(f"{names[0]} has no dev split; use --mode test or fasttest")
        else:
            known = ", ".join([*TASK_GROUPS, *TASK_FILES])
            raise ConfigError(f"unknown task {item!r}; expected one of {known}")
        out.extend(n for n in names if n not in out)
    if not out:
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


def _files_size(root: os.PathLike[str] | str, task: str) -> float:
    """Bytes of ``task``'s files in the SentEval folder (the weight of its progress step)."""
    total = 0
    for name in TASK_FILES.get(task, ()):
        try:
            total += os.path.getsize(os.path.join(root, name))
        except OSError:  # a task reading fewer files than listed still weighs something
            continue
    return float(total)


def evaluate(
    encoder: EncoderLike,
    tasks: str | Iterable[str] | None = "sts",
    mode: str = "test",
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 128,
    download: bool = True,
    transfer_config: transfer.ClassifierConfig | None = None,
    model_name: str | None = None,
    sts_files: Sequence[str | os.PathLike[str] | ScoredPairs] = (),
    sts_columns: Sequence[str] | None = None,
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

    Returns:
        ``{"model", "pooler", "mode", "tasks", "data_dir", "date", "results": {task: ...},
        "headline", "timing", "encoding"}``. Correlations are in [-1, 1] (as SentEval),
        accuracies in %; ``headline`` has the paper tables (x 100, two decimals).
    """
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    files = [
        f if isinstance(f, ScoredPairs) else custom.read_sts_file(f, sts_columns) for f in sts_files
    ]
    names = parse_tasks(tasks, mode) if tasks is not None or not files else []
    root = ensure_data(names, data_dir, download_missing=download) if names else None
    started = time.perf_counter()
    results: dict[str, dict] = {}
    timing: dict[str, float] = {}
    sts_cache = EmbeddingCache(encoder, batch_size)
    split = "dev" if mode == "dev" else "test"

    sts_names = [t for t in names if t in sts.STS_TASKS]
    transfer_names = [t for t in names if t in transfer.TRANSFER_TASKS]
    steps = []  # (label, weight) in the order run below
    if sts_names:
        steps.append((", ".join(sts_names), sum(_files_size(root, t) for t in sts_names)))
    if ALIGN_UNIFORM in names:
        steps.append((ALIGN_UNIFORM, _files_size(root, ALIGN_UNIFORM)))
    for pairs in files:
        steps.append((str(pairs.path), float(sum(map(len, pairs.sent1 + pairs.sent2)))))
    steps += [(t, _files_size(root, t)) for t in transfer_names]
    progress = TaskProgress(steps)

    if sts_names:
        progress.start()
        t0 = time.perf_counter()
        results.update(sts.evaluate_sts(sts_cache, sts_names, split, root))
        timing["sts"] = time.perf_counter() - t0
        log.info(
            "STS (%s): %d distinct sentences encoded in %.1fs",
            ", ".join(sts_names), sts_cache.encoded, timing["sts"],
        )  # fmt: skip
        progress.end()
    if ALIGN_UNIFORM in names:
        progress.start()
        t0 = time.perf_counter()
        results[ALIGN_UNIFORM] = alignment.align_uniform(sts_cache, root)
        timing[ALIGN_UNIFORM] = time.perf_counter() - t0
        progress.end()
    for pairs in files:
        progress.start()
        t0 = time.perf_counter()
        name = pairs.name if pairs.name not in results else f"{pairs.name} ({pairs.path})"
        results[name] = custom.evaluate_pairs(sts_cache, pairs)
        timing[name] = time.perf_counter() - t0
        progress.end()
    encodings = {"distinct": sts_cache.encoded, "requested": sts_cache.requested}
    encode_s = sts_cache.encode_seconds
    for task in transfer_names:
        progress.start()
        # a fresh cache per task: transfer tasks share no sentences and SST-2 alone is 70k
        cache = EmbeddingCache(encoder, batch_size)
        t0 = time.perf_counter()
        results[task] = transfer.evaluate_transfer_task(cache, task, root, mode, transfer_config)
        timing[task] = time.perf_counter() - t0
        encodings["distinct"] += cache.encoded
        encodings["requested"] += cache.requested
        encode_s += cache.encode_seconds
        progress.end()
    timing["encode"] = encode_s
    timing["total"] = time.perf_counter() - started

    pooler = getattr(getattr(encoder, "pooler", None), "kind", None)  # a cselab SentenceEncoder
    out = {
        "model": model_name or getattr(encoder, "source", None),
        "pooler": pooler if isinstance(pooler, str) else None,
        "mode": mode,
        "tasks": names,
        "data_dir": str(root) if root is not None else None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "results": results,
        "timing": timing,
        "encoding": encodings,
    }
    out["headline"] = headline(out)
    return out
