"""Loaders for SentEval's ``data/downstream/`` folder (STS12-16, STS-B, SICK and 7 transfer tasks).

Every loader reproduces what SentEval's own loader (facebookresearch/SentEval ``senteval/*.py``,
as shipped in princeton-nlp/SimCSE ``SentEval/``) hands to the encoder: the same lines, the
same encoding, the same fields, and each sentence as its whitespace tokens re-joined by single
spaces (SentEval splits lines into tokens; SimCSE's batcher joins them back with ``' '``).

The files are decoded and split into lines by :mod:`cselab.io.readers` (``read_text``;
``universal_lines`` where SentEval iterates over the file, ``str.splitlines`` where it calls that;
``tsv_fields``), and SICK is parsed by its ``read_sick``, which training's SICK triplets use too.

Where SentEval would silently mis-read a damaged file (a gold file one line short, a score that
is not a number) these loaders raise :class:`DataFormatError` naming the file and the line.
Parsed files are cached per (path, mtime, size), so repeated calls (the trainer scores STS-B
dev every few hundred steps) parse each file once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..core.errors import DataFormatError, MissingDataError  # noqa: F401 - re-exported
from ..core.metrics import STSB
from ..io.readers import read_sick as read_sick_rows
from ..io.readers import read_text, score_field, tsv_fields, universal_lines

ENV_VAR = "CSELAB_DATA"

#: STS12-16 subsets, in SentEval's order (``senteval/sts.py``). STS13 has no ``SMT`` (LDC licence).
STS_YEARS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}

#: Split name -> file, for the two STS tasks that have splits (SentEval's ``dev`` of SICK is trial).
STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}


def stsb_file(split: str) -> str:
    """STS-B's ``split`` file relative to the data folder (``STS/STSBenchmark/sts-dev.csv``)."""
    return f"STS/STSBenchmark/{STSB_FILES[split]}"


#: Binary tasks: (folder, file labelled 1, file labelled 0), as in SentEval ``senteval/binary.py``.
#: Note SUBJ: SentEval passes ``subj.objective`` first, so *objective* sentences get label 1.
BINARY_TASKS: dict[str, tuple[str, str, str]] = {
    "MR": ("MR", "rt-polarity.pos", "rt-polarity.neg"),
    "CR": ("CR", "custrev.pos", "custrev.neg"),
    "SUBJ": ("SUBJ", "subj.objective", "subj.subjective"),
    "MPQA": ("MPQA", "mpqa.pos", "mpqa.neg"),
}
SST_FILES = {"train": "sentiment-train", "dev": "sentiment-dev", "test": "sentiment-test"}
TREC_FILES = {"train": "train_5500.label", "test": "TREC_10.label"}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # SentEval's tgt2idx order
MRPC_FILES = {"train": "msr_paraphrase_train.txt", "test": "msr_paraphrase_test.txt"}


def _sts_year_files(year: str) -> tuple[str, ...]:
    return tuple(
        f"STS/{year}-en-test/STS.{kind}.{subset}.txt"
        for subset in STS_YEARS[year]
        for kind in ("input", "gs")
    )


#: Files each task reads, relative to the data folder (used for the "missing files" error).
TASK_FILES: dict[str, tuple[str, ...]] = {
    **{year: _sts_year_files(year) for year in STS_YEARS},
    "STSBenchmark": tuple(stsb_file(s) for s in ("dev", "test")),
    "SICKRelatedness": tuple(f"SICK/{SICK_FILES[s]}" for s in ("dev", "test")),
    **{t: (f"{d}/{a}", f"{d}/{b}") for t, (d, a, b) in BINARY_TASKS.items()},
    "SST2": tuple(f"SST/binary/{f}" for f in SST_FILES.values()),
    "TREC": tuple(f"TREC/{f}" for f in TREC_FILES.values()),
    "MRPC": tuple(f"MRPC/{f}" for f in MRPC_FILES.values()),
    "AlignUniform": (stsb_file("dev"),),
}


# --------------------------------------------------------------------------------------------
# data folder


def default_cache_dir() -> Path:
    """``senteval/`` in cselab's cache (:func:`cselab.model.hub.cache_root`: ``$CSELAB_CACHE``,
    else ``$XDG_CACHE_HOME/cselab``, else ``~/.cache/cselab``)."""
    from ..model.hub import cache_root

    return cache_root() / "senteval"


def resolve_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The SentEval ``data/downstream/`` folder: ``explicit`` > ``$CSELAB_DATA`` > user cache.

    A folder that holds ``downstream/`` (SentEval's ``data/``) is accepted and resolved to
    ``downstream/``. The folder need not exist yet (the cache is filled on first use).
    """
    if explicit is not None and str(explicit) != "":
        path = Path(explicit).expanduser()
    elif os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR]).expanduser()
    else:
        path = default_cache_dir()
    if (path / "downstream").is_dir() and not (path / "STS").is_dir():
        path = path / "downstream"
    return path


# --------------------------------------------------------------------------------------------
# data containers


@dataclass(frozen=True, eq=False)
class ScoredPairs:
    """Sentence pairs with a gold similarity score (one STS subset, or one STS-B/SICK split)."""

    name: str
    sent1: tuple[str, ...]
    sent2: tuple[str, ...]
    scores: np.ndarray  # float64, one per pair
    path: Path

    def __len__(self) -> int:
        return len(self.scores)


@dataclass(frozen=True, eq=False)
class LabelledSentences:
    """Single sentences with integer class labels, in the order SentEval reads them."""

    name: str
    sentences: tuple[str, ...]
    labels: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class LabelledPairs:
    """Sentence pairs with integer class labels (MRPC), in the order SentEval reads them."""

    name: str
    sent1: tuple[str, ...]
    sent2: tuple[str, ...]
    labels: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.labels)


# --------------------------------------------------------------------------------------------
# low-level reading

T = TypeVar("T")
_CACHE: dict[tuple[Any, ...], Any] = {}


def _cached(kind: str, paths: Sequence[Path], build: Callable[[], T]) -> T:
    """Memoise ``build()`` on the identity (path, mtime, size) of the files it reads."""
    key: list[Any] = [kind]
    for p in paths:
        try:
            st = p.stat()
        except OSError as exc:
            raise MissingDataError(f"{p}: file not found") from exc
        key.append((str(p.resolve()), st.st_mtime_ns, st.st_size))
    k = tuple(key)
    if k not in _CACHE:
        _CACHE[k] = build()
    return _CACHE[k]


def clear_cache() -> None:
    """Forget every parsed file (tests use it; files are re-read on the next call)."""
    _CACHE.clear()


def _join(text: str) -> str:
    """SentEval's token list (``str.split()``) joined back with single spaces, as SimCSE does."""
    return " ".join(text.split())


def _int_label(path: Path, lineno: int, field: str, allowed: Iterable[int]) -> int:
    try:
        value = int(field)
    except ValueError:
        raise DataFormatError(path, lineno, f"label {field!r} is not an integer") from None
    allowed = tuple(allowed)
    if value not in allowed:
        raise DataFormatError(path, lineno, f"label {value} is not one of {allowed}")
    return value


def _fields(path: Path, lineno: int, line: str, at_least: int) -> list[str]:
    parts = tsv_fields(line.strip())
    if len(parts) < at_least:
        raise DataFormatError(
            path, lineno, f"expected at least {at_least} tab-separated fields, found {len(parts)}"
        )
    return parts


# --------------------------------------------------------------------------------------------
# STS12-16


def read_sts_subset(input_path: Path, gold_path: Path, name: str) -> ScoredPairs:
    """One ``STS.input.X.txt`` + ``STS.gs.X.txt`` pair of files (SentEval ``STSEval.loadFile``).

    Both files are split with ``str.splitlines`` and stay aligned line by line; a pair counts
    only if its gold line is not empty (STS15/16 leave unscored pairs blank).
    """
    inputs = read_text(input_path, "utf-8").splitlines()
    golds = read_text(gold_path, "utf-8").splitlines()
    if len(golds) != len(inputs):
        shorter, n = (
            (gold_path, len(golds)) if len(golds) < len(inputs) else (input_path, len(inputs))
        )
        other = input_path if shorter == gold_path else gold_path
        raise DataFormatError(
            shorter,
            n + 1,
            f"missing line: the file has {n} lines but {other.name} has "
            f"{max(len(golds), len(inputs))}; gold and input files must be aligned line by line",
        )
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for i, (line, gold) in enumerate(zip(inputs, golds, strict=True), start=1):
        if gold == "":
            continue
        parts = tsv_fields(line)
        if len(parts) != 2:
            raise DataFormatError(
                input_path, i, f"expected 2 tab-separated sentences, found {len(parts)} fields"
            )
        scores.append(score_field(gold_path, i, gold))
        s1.append(_join(parts[0]))
        s2.append(_join(parts[1]))
    return ScoredPairs(name, tuple(s1), tuple(s2), np.asarray(scores, dtype=np.float64), gold_path)


def load_sts_year(
    year: str, data_dir: str | os.PathLike[str] | None = None
) -> dict[str, ScoredPairs]:
    """STS12..STS16: ``{subset: pairs}`` in SentEval's subset order."""
    if year not in STS_YEARS:
        raise ValueError(f"unknown STS year {year!r}; expected one of {', '.join(STS_YEARS)}")
    folder = resolve_data_dir(data_dir) / "STS" / f"{year}-en-test"
    out: dict[str, ScoredPairs] = {}
    for subset in STS_YEARS[year]:
        inp = folder / f"STS.input.{subset}.txt"
        gold = folder / f"STS.gs.{subset}.txt"
        out[subset] = _cached(
            "sts", (inp, gold), lambda inp=inp, gold=gold, s=subset: read_sts_subset(inp, gold, s)
        )
    return out


# --------------------------------------------------------------------------------------------
# STS-B and SICK


def read_stsb(path: Path, name: str = "STSBenchmark") -> ScoredPairs:
    """``sts-*.csv``: tab-separated, no header, no quoting; score = field 4, sentences = 5, 6.

    The raw release has 9 fields on some lines (attribution); only the first 7 are read.
    """
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for i, line in enumerate(universal_lines(read_text(path, "utf-8")), start=1):
        parts = _fields(path, i, line, 7)
        scores.append(score_field(path, i, parts[4]))
        s1.append(_join(parts[5]))
        s2.append(_join(parts[6]))
    return ScoredPairs(name, tuple(s1), tuple(s2), np.asarray(scores, dtype=np.float64), path)


def read_sick(path: Path, name: str = "SICKRelatedness") -> ScoredPairs:
    """``SICK_*.txt`` as :func:`cselab.io.readers.read_sick` reads it (training's SICK triplets
    are read by the same function): sentences A and B and the relatedness score of each pair."""
    rows = read_sick_rows(path)
    return ScoredPairs(
        name,
        tuple(_join(r.sentence_a) for r in rows),
        tuple(_join(r.sentence_b) for r in rows),
        np.asarray([r.relatedness for r in rows], dtype=np.float64),
        path,
    )


def _check_split(split: str, allowed: dict[str, str], task: str) -> str:
    if split not in allowed:
        raise ValueError(f"{task} has no split {split!r}; expected one of {', '.join(allowed)}")
    return allowed[split]


def load_stsb(split: str = "test", data_dir: str | os.PathLike[str] | None = None) -> ScoredPairs:
    """STS Benchmark ``train`` / ``dev`` / ``test`` (5,749 / 1,500 / 1,379 pairs)."""
    _check_split(split, STSB_FILES, "STSBenchmark")
    path = resolve_data_dir(data_dir) / stsb_file(split)
    return _cached(STSB, (path,), lambda: read_stsb(path, f"STSBenchmark-{split}"))


def load_sick(split: str = "test", data_dir: str | os.PathLike[str] | None = None) -> ScoredPairs:
    """SICK relatedness ``train`` / ``dev`` (trial) / ``test`` (4,500 / 500 / 4,927 pairs)."""
    path = resolve_data_dir(data_dir) / "SICK" / _check_split(split, SICK_FILES, "SICKRelatedness")
    return _cached("sick", (path,), lambda: read_sick(path, f"SICKRelatedness-{split}"))


# --------------------------------------------------------------------------------------------
# transfer tasks


def _read_latin1_sentences(path: Path) -> list[str]:
    # SentEval binary.py: latin-1, ``splitlines()``, then ``split()``; empty lines stay samples.
    return [_join(line) for line in read_text(path, "latin-1").splitlines()]


def load_binary(task: str, data_dir: str | os.PathLike[str] | None = None) -> LabelledSentences:
    """MR / CR / SUBJ / MPQA: the label-1 file then the label-0 file (SentEval's order)."""
    if task not in BINARY_TASKS:
        raise ValueError(f"unknown binary task {task!r}; expected one of {', '.join(BINARY_TASKS)}")
    folder, pos_name, neg_name = BINARY_TASKS[task]
    root = resolve_data_dir(data_dir) / folder
    pos_path, neg_path = root / pos_name, root / neg_name

    def build() -> LabelledSentences:
        pos = _read_latin1_sentences(pos_path)
        neg = _read_latin1_sentences(neg_path)
        labels = np.asarray([1] * len(pos) + [0] * len(neg), dtype=np.int64)
        return LabelledSentences(task, tuple(pos + neg), labels)

    return _cached("binary", (pos_path, neg_path), build)


def read_sst2(path: Path, name: str = "SST2") -> LabelledSentences:
    """``sentiment-*``: ``sentence<TAB>label`` per line, UTF-8 (SentEval ``senteval/sst.py``)."""
    sents: list[str] = []
    labels: list[int] = []
    for i, line in enumerate(universal_lines(read_text(path, "utf-8")), start=1):
        parts = _fields(path, i, line, 2)
        labels.append(_int_label(path, i, parts[1], (0, 1)))
        sents.append(_join(parts[0]))
    return LabelledSentences(name, tuple(sents), np.asarray(labels, dtype=np.int64))


def load_sst2(
    split: str = "train", data_dir: str | os.PathLike[str] | None = None
) -> LabelledSentences:
    """SST-2 ``train`` (67,349 phrases) / ``dev`` (872) / ``test`` (1,821)."""
    path = resolve_data_dir(data_dir) / "SST" / "binary" / _check_split(split, SST_FILES, "SST2")
    return _cached("sst2", (path,), lambda: read_sst2(path, f"SST2-{split}"))


def read_trec(path: Path, name: str = "TREC") -> LabelledSentences:
    """``COARSE:fine words...`` per line, latin-1; label = coarse class, text = after 1st space."""
    sents: list[str] = []
    labels: list[int] = []
    for i, line in enumerate(universal_lines(read_text(path, "latin-1")), start=1):
        target, sep, rest = line.strip().partition(":")
        if not sep or " " not in rest:
            raise DataFormatError(path, i, "expected 'COARSE:fine question words'")
        if target not in TREC_CLASSES:
            raise DataFormatError(path, i, f"unknown TREC class {target!r}")
        labels.append(TREC_CLASSES.index(target))
        sents.append(_join(rest.split(" ", 1)[1]))
    return LabelledSentences(name, tuple(sents), np.asarray(labels, dtype=np.int64))


def load_trec(
    split: str = "train", data_dir: str | os.PathLike[str] | None = None
) -> LabelledSentences:
    """TREC ``train`` (5,452) / ``test`` (500), 6 coarse classes."""
    path = resolve_data_dir(data_dir) / "TREC" / _check_split(split, TREC_FILES, "TREC")
    return _cached("trec", (path,), lambda: read_trec(path, f"TREC-{split}"))


def read_mrpc(path: Path, name: str = "MRPC") -> LabelledPairs:
    """``Quality  #1 ID  #2 ID  #1 String  #2 String`` with a header row (and a UTF-8 BOM)."""
    lines = universal_lines(read_text(path, "utf-8"))
    if not lines or not lines[0].lstrip("\ufeff").startswith("Quality"):
        raise DataFormatError(path, 1, "expected the header line 'Quality<TAB>#1 ID<TAB>...'")
    s1: list[str] = []
    s2: list[str] = []
    labels: list[int] = []
    for i, line in enumerate(lines[1:], start=2):
        parts = _fields(path, i, line, 5)
        labels.append(_int_label(path, i, parts[0], (0, 1)))
        s1.append(_join(parts[3]))
        s2.append(_join(parts[4]))
    return LabelledPairs(name, tuple(s1), tuple(s2), np.asarray(labels, dtype=np.int64))


def load_mrpc(
    split: str = "train", data_dir: str | os.PathLike[str] | None = None
) -> LabelledPairs:
    """MRPC ``train`` (4,076 pairs) / ``test`` (1,725 pairs)."""
    path = resolve_data_dir(data_dir) / "MRPC" / _check_split(split, MRPC_FILES, "MRPC")
    return _cached("mrpc", (path,), lambda: read_mrpc(path, f"MRPC-{split}"))
