"""Your own STS-format pairs: read and validate a file, score an encoder on it, select models.

A file of sentence pairs with a gold similarity score, in one of these forms:

* ``.tsv`` / ``.tab`` (tab-separated, no quoting) or ``.csv`` (comma-separated, CSV quoting),
  with a header row naming the columns;
* ``.jsonl``: one JSON object per line (blank lines skipped);
* a folder written by ``datasets.Dataset.save_to_disk`` (a ``DatasetDict`` folder with one
  split, or one split's sub-folder).

The three columns are named by ``columns`` (default ``sentence1``, ``sentence2``, ``score``).
Everything is checked when the file is read, before any model is loaded: a missing column, an
empty sentence, a score that is not a finite number, fewer than :data:`MIN_PAIRS` pairs or
constant scores raise :class:`~cselab.evaluation.datasets.DataFormatError` naming the file, the
line (or row) and the column.

The score is the correlation (Spearman or Pearson) between the cosine of the two sentence
vectors and the gold score, exactly as for STS-B (:mod:`cselab.evaluation.sts`). Sentences are
used as written (no SentEval re-tokenisation: that is a property of SentEval's files).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.schema import ConfigError
from .datasets import DataFormatError, MissingDataError, ScoredPairs, _cached, _decode
from .embed import EmbeddingCache, EncoderLike, call_encoder
from .sts import correlations, cosine_similarity

DEFAULT_COLUMNS = ("sentence1", "sentence2", "score")
#: Fewer pairs than this give no meaningful correlation.
MIN_PAIRS = 5
METRICS = ("spearman", "pearson")
#: Marks a result entry as a user's STS file (the report gives such entries their own table).
KIND = "sts-file"


def dev_score_name(dev: str, metric: str = "spearman") -> str:
    """The name of the ``eval.dev`` score in ``metrics.csv``, ``results.json`` and the callbacks:
    ``stsb_dev`` (STS-B, Spearman, as before), ``stsb_dev_pearson``, and ``dev_spearman`` /
    ``dev_pearson`` for a file."""
    if dev.lower() == "stsb":
        return "stsb_dev" if metric == "spearman" else f"stsb_dev_{metric}"
    return f"dev_{metric}"


#: Every name :func:`dev_score_name` gives.
DEV_SCORE_NAMES = tuple(dev_score_name(dev, m) for dev in ("stsb", "file") for m in METRICS)
#: The ``metrics.csv`` columns an evaluation writes: the dev score, and alignment and uniformity
#: (Wang & Isola 2020) of STS-B dev; every other column of a row is a training metric.
EVAL_COLUMNS = (*DEV_SCORE_NAMES, "align", "uniform")


def _columns(columns: Sequence[str] | None) -> tuple[str, str, str]:
    cols = tuple(columns or DEFAULT_COLUMNS)
    if len(cols) != 3 or len(set(cols)) != 3 or not all(isinstance(c, str) and c for c in cols):
        raise ConfigError(
            f"STS columns must be three distinct names (sentence 1, sentence 2, score), got {list(cols)}"
        )
    return cols  # type: ignore[return-value]


def _check_row(
    path: Path, where: int | None, row: dict[str, Any], cols: tuple[str, str, str], prefix: str
) -> tuple[str, str, float]:
    """One row's two sentences and score, or an error naming the row and the column."""
    values = []
    for col in cols:
        if col not in row or row[col] is None:
            raise DataFormatError(path, where, f"{prefix}column '{col}' is missing")
        values.append(row[col])
    s1, s2, raw = values
    for col, text in zip(cols[:2], (s1, s2), strict=True):
        if not isinstance(text, str):
            raise DataFormatError(path, where, f"{prefix}column '{col}' is not text: {text!r}")
        if not text.strip():
            raise DataFormatError(path, where, f"{prefix}column '{col}' is empty")
    score = math.nan
    if not isinstance(raw, bool):  # float(True) is 1.0, but a boolean is no similarity score
        with contextlib.suppress(TypeError, ValueError):
            score = float(raw)
    if not math.isfinite(score):
        raise DataFormatError(
            path, where, f"{prefix}column '{cols[2]}': {raw!r} is not a finite number"
        )
    return s1, s2, score


def _read_delimited(path: Path, cols: tuple[str, str, str]) -> list[tuple[str, str, float]]:
    tsv = path.suffix.lower() != ".csv"
    text = _decode(path, "utf-8-sig")
    reader = csv.reader(
        io.StringIO(text, newline=""),
        delimiter="\t" if tsv else ",",
        # TSV files of sentences carry literal quote characters; only CSV uses quoting.
        quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL,
    )
    try:
        header = next(reader)
    except StopIteration:
        raise DataFormatError(path, 1, "the file is empty (expected a header row)") from None
    except csv.Error as err:
        raise DataFormatError(path, 1, f"unreadable header: {err}") from None
    header = [h.strip() for h in header]
    for col in cols:
        if col not in header:
            raise DataFormatError(
                path,
                1,
                f"no column '{col}' in the header ({', '.join(header)}); name the columns with "
                "eval.dev_columns or --sts-columns",
            )
    index = [header.index(c) for c in cols]
    out = []
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise DataFormatError(path, reader.line_num, str(err)) from None
        if not fields or all(not f.strip() for f in fields):
            continue  # a blank line
        row = {c: fields[i] for c, i in zip(cols, index, strict=True) if i < len(fields)}
        out.append(_check_row(path, reader.line_num, row, cols, ""))
    return out


def _read_jsonl(path: Path, cols: tuple[str, str, str]) -> list[tuple[str, str, float]]:
    out = []
    for lineno, line in enumerate(_decode(path, "utf-8-sig").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataFormatError(path, lineno, f"invalid JSON: {err.msg}") from None
        if not isinstance(row, dict):
            raise DataFormatError(path, lineno, "expected a JSON object")
        out.append(_check_row(path, lineno, row, cols, ""))
    return out


def _read_saved_dataset(path: Path, cols: tuple[str, str, str]) -> list[tuple[str, str, float]]:
    try:
        import datasets
    except ImportError:
        raise MissingDataError(
            f"{path}: reading a saved `datasets` folder needs the datasets package "
            "(pip install 'cselab[data]')"
        ) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise DataFormatError(path, None, f"not a folder written by save_to_disk ({err})") from None
    if isinstance(ds, datasets.DatasetDict):
        if len(ds) != 1:
            raise DataFormatError(
                path,
                None,
                f"a DatasetDict with splits {', '.join(ds)}; point at one split's folder, "
                f"e.g. {path / next(iter(ds))}",
            )
        ds = next(iter(ds.values()))
    missing = [c for c in cols if c not in ds.column_names]
    if missing:
        raise DataFormatError(
            path,
            None,
            f"no column '{missing[0]}' (the dataset has: {', '.join(ds.column_names)}); name the "
            "columns with eval.dev_columns or --sts-columns",
        )
    data = ds.select_columns(list(cols)).to_dict()
    return [
        _check_row(path, None, dict(zip(cols, values, strict=True)), cols, f"row {i}: ")
        for i, values in enumerate(zip(*(data[c] for c in cols), strict=True))
    ]


def read_sts_file(
    path: str | os.PathLike[str], columns: Sequence[str] | None = None
) -> ScoredPairs:
    """Read and validate an STS-format file or saved dataset folder (see the module docstring).

    Parsed once per (file, mtime, size) and column names, like the SentEval loaders.
    """
    p = Path(path)
    cols = _columns(columns)
    if p.is_dir():
        readers: Callable[[Path, tuple[str, str, str]], list] = _read_saved_dataset
        identity = [f for f in sorted(p.rglob("*")) if f.is_file()]
    elif p.is_file():
        suffix = p.suffix.lower()
        if suffix in (".tsv", ".tab", ".csv"):
            readers = _read_delimited
        elif suffix == ".jsonl":
            readers = _read_jsonl
        else:
            raise DataFormatError(
                p,
                None,
                "unknown format: expected .tsv, .tab, .csv, .jsonl or a save_to_disk folder",
            )
        identity = [p]
    else:
        raise MissingDataError(f"{p}: STS file not found")

    def build() -> ScoredPairs:
        rows = readers(p, cols)
        if len(rows) < MIN_PAIRS:
            raise DataFormatError(
                p, None, f"{len(rows)} scored pairs; at least {MIN_PAIRS} are needed"
            )
        scores = np.asarray([r[2] for r in rows], dtype=np.float64)
        if np.all(scores == scores[0]):
            raise DataFormatError(
                p, None, f"every score in column '{cols[2]}' is {scores[0]:g}: no correlation"
            )
        return ScoredPairs(p.name, tuple(r[0] for r in rows), tuple(r[1] for r in rows), scores, p)

    return _cached(f"sts-file:{','.join(cols)}", identity, build)


def evaluate_pairs(cache: EmbeddingCache, pairs: ScoredPairs) -> dict[str, Any]:
    """``{"kind", "path", "pearson", "spearman", "n"}`` of cosine vs gold for one file."""
    cache.add([*pairs.sent1, *pairs.sent2])
    system = cosine_similarity(cache.embed(pairs.sent1), cache.embed(pairs.sent2))
    return {"kind": KIND, "path": str(pairs.path), **correlations(system, pairs.scores)}


class PairsScorer:
    """``encoder -> correlation x 100`` on fixed pairs, each distinct sentence encoded once.

    Used for model selection during training (``eval.dev``); an ``nn.Module`` encoder is put
    in eval mode for the call and its state restored (:func:`~cselab.evaluation.embed.call_encoder`).
    """

    def __init__(self, pairs: ScoredPairs, metric: str = "spearman", batch_size: int = 128) -> None:
        if metric not in METRICS:
            raise ConfigError(
                f"unknown dev metric {metric!r}; expected one of {', '.join(METRICS)}"
            )
        self.pairs, self.metric, self.batch_size = pairs, metric, batch_size
        # longest first: batches of similar length pad less
        self.unique = sorted(dict.fromkeys(pairs.sent1 + pairs.sent2), key=len, reverse=True)
        index = {s: i for i, s in enumerate(self.unique)}
        self.i1 = np.array([index[s] for s in pairs.sent1], dtype=np.int64)
        self.i2 = np.array([index[s] for s in pairs.sent2], dtype=np.int64)

    def __call__(self, encoder: EncoderLike) -> float:
        vectors = call_encoder(encoder, list(self.unique), self.batch_size)
        system = cosine_similarity(vectors[self.i1], vectors[self.i2])
        return 100.0 * correlations(system, self.pairs.scores)[self.metric]


def dev_evaluator(
    dev: str,
    metric: str = "spearman",
    columns: Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 128,
) -> Callable[[EncoderLike], float | dict[str, float]] | None:
    """The model-selection score of ``eval.dev``, with a ``name`` attribute for the logs.

    The evaluator returns the score, or a dict of numbers with the score under ``name``: for
    STS-B dev also ``align`` and ``uniform`` (:func:`~cselab.evaluation.sts.stsb_dev_measures`),
    logged at every evaluation next to the score.

    ``dev``: ``stsb`` (STS-B dev, as SimCSE), ``none`` (no selection: returns ``None``) or the
    path of an STS-format file / saved dataset, read and validated here, before training.
    The name is :func:`dev_score_name`'s; the value is the correlation x 100.
    """
    if metric not in METRICS:
        raise ConfigError(f"unknown dev metric {metric!r}; expected one of {', '.join(METRICS)}")
    if dev.lower() == "none":
        return None
    if dev.lower() == "stsb":
        from .sts import stsb_dev_measures

        name = dev_score_name(dev, metric)

        def evaluate(encoder: EncoderLike) -> dict[str, float]:
            # One encoding serves the score and alignment/uniformity (SimCSE Fig. 2).
            out = stsb_dev_measures(encoder, data_dir, batch_size=batch_size)
            return {name: out[metric], "align": out["align"], "uniform": out["uniform"]}

        evaluate.name = name  # type: ignore[attr-defined]
        evaluate.source = "stsb"  # type: ignore[attr-defined]
        return evaluate
    scorer_ = PairsScorer(read_sts_file(dev, columns), metric, batch_size)

    def evaluate_file(encoder: EncoderLike) -> float:
        return scorer_(encoder)

    evaluate_file.name = dev_score_name(dev, metric)  # type: ignore[attr-defined]
    evaluate_file.source = str(dev)  # type: ignore[attr-defined]
    return evaluate_file
