"""Your own STS-format pairs: read and validate a file, score an encoder on it, select models.

A file of sentence pairs with a gold similarity score, in one of these forms, read by
:mod:`cselab.io.readers` with its rules (the same rows as training reads from the same file):

* ``.tsv`` / ``.tab`` (tab-separated, no quoting) or ``.csv`` (RFC 4180 quoting), with a header
  row naming the columns;
* ``.jsonl``: one JSON object per line (blank lines skipped);
* ``.parquet``, or a folder written by ``datasets.Dataset.save_to_disk`` (a ``DatasetDict``
  folder with one split, or one split's sub-folder).

The three columns are named by ``columns`` (default ``sentence1``, ``sentence2``, ``score``).
Everything is checked when the file is read, before any model is loaded: a missing or
duplicated column, an empty or non-text sentence, a score that is not a finite number, fewer
than :data:`MIN_PAIRS` pairs or constant scores raise
:class:`~cselab.core.errors.DataFormatError` naming the file, the line (or row) and the column.

The score is the correlation (Spearman or Pearson) between the cosine of the two sentence
vectors and the gold score, exactly as for STS-B (:mod:`cselab.evaluation.sts`). Sentences are
used as written (no SentEval re-tokenisation: that is a property of SentEval's files).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.devset import DEV_COLUMNS, STSB, DevSet, check_sts_columns, resolve_dev_set
from ..core.metrics import DEV_CUTOFFS, RETRIEVAL_MEASURES, dev_score_name  # noqa: F401
from ..core.schema import ConfigError
from ..io.readers import open_table
from ..model.choices import BATCH_SIZE
from .datasets import DataFormatError, MissingDataError, ScoredPairs, _cached  # noqa: F401
from .embed import EmbeddingCache, EncoderLike, RepeatedSentences
from .names import STS_COLUMNS_HINT, STS_FILE_KIND
from .sts import correlations, cosine_similarity

if TYPE_CHECKING:  # the retrieval module loads only for a BEIR dev folder
    from .retrieval import RetrievalScorer

#: Fewer pairs than this give no meaningful correlation.
MIN_PAIRS = 5
METRICS = ("spearman", "pearson")
#: Marks a result entry as a user's STS file (the report gives such entries their own table).
KIND = STS_FILE_KIND


#: Every name :func:`dev_score_name` gives (a BEIR folder's at the cut-offs selection accepts).
DEV_SCORE_NAMES = (
    *(dev_score_name(dev, m) for dev in (STSB, "file") for m in METRICS),
    *(dev_score_name("beir", f"{m}@{k}") for m in RETRIEVAL_MEASURES for k in DEV_CUTOFFS),
)
#: The ``metrics.csv`` columns an evaluation writes: the dev score, and alignment and uniformity
#: (Wang & Isola 2020) of STS-B dev; every other column of a row is a training metric.
EVAL_COLUMNS = (*DEV_SCORE_NAMES, "align", "uniform")


def _columns(columns: Sequence[str] | None) -> tuple[str, str, str]:
    return check_sts_columns(columns or DEV_COLUMNS)


def _read_rows(path: Path, cols: tuple[str, str, str]) -> list[tuple[str, str, float]]:
    """Every row's two sentences and score, or an error naming the file, line (or row) and
    column (the rules of :mod:`cselab.io.readers`)."""
    table = open_table(path)
    table.require(cols, STS_COLUMNS_HINT)
    return [(row.text(cols[0]), row.text(cols[1]), row.number(cols[2])) for row in table]


def read_sts_file(
    path: str | os.PathLike[str], columns: Sequence[str] | None = None
) -> ScoredPairs:
    """Read and validate an STS-format file or saved dataset folder (see the module docstring).

    Parsed once per (file, mtime, size) and column names, like the SentEval loaders.
    """
    p = Path(path)
    cols = _columns(columns)
    if p.is_dir():
        identity = [f for f in sorted(p.rglob("*")) if f.is_file()]
    elif p.is_file():
        identity = [p]
    else:
        raise MissingDataError(f"{p}: STS file not found")

    def build() -> ScoredPairs:
        rows = _read_rows(p, cols)
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

    def __init__(
        self,
        pairs: ScoredPairs,
        metric: str = "spearman",
        batch_size: int = BATCH_SIZE,
        precision: str = "fp32",
    ) -> None:
        if metric not in METRICS:
            raise ConfigError(
                f"unknown dev metric {metric!r}; expected one of {', '.join(METRICS)}"
            )
        self.pairs, self.metric, self.batch_size = pairs, metric, batch_size
        self.precision = precision  # a cselab encoder's autocast (RepeatedSentences)
        # longest first: batches of similar length pad less
        self.unique = sorted(dict.fromkeys(pairs.sent1 + pairs.sent2), key=len, reverse=True)
        index = {s: i for i, s in enumerate(self.unique)}
        self.i1 = np.array([index[s] for s in pairs.sent1], dtype=np.int64)
        self.i2 = np.array([index[s] for s in pairs.sent2], dtype=np.int64)
        self.repeated = RepeatedSentences()  # tokenised once, kept on the model's device

    def __call__(self, encoder: EncoderLike) -> float:
        vectors = self.repeated(encoder, self.unique, self.batch_size, precision=self.precision)
        system = cosine_similarity(vectors[self.i1], vectors[self.i2])
        return 100.0 * correlations(system, self.pairs.scores)[self.metric]


class DevEvaluator:
    """The model-selection score of a resolved :class:`~cselab.config.devset.DevSet`: called on
    an encoder, it returns the score x 100, or a dict of numbers with the score under
    :attr:`name` (STS-B dev also gives ``align`` and ``uniform``,
    :func:`~cselab.evaluation.sts.stsb_dev_measures`, logged next to the score).

    A dev file or BEIR folder is read and validated here, before training; the run's plan
    then says how its sentences are encoded (:meth:`encode_with`).
    """

    def __init__(
        self,
        dev: DevSet,
        data_dir: str | os.PathLike[str] | None = None,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        self.dev = dev
        self.data_dir = data_dir
        self.batch_size, self.precision = batch_size, "fp32"
        self._repeated = RepeatedSentences()  # STS-B dev tokenised once, kept on the device
        self._score: Callable[[EncoderLike], float | dict[str, float]]
        self._scorer: PairsScorer | RetrievalScorer | None = None
        if dev.kind == "retrieval":
            self._score = self._retrieval()
        elif dev.kind == STSB:
            self._score = self._stsb
        else:
            self._scorer = PairsScorer(read_sts_file(dev.path, dev.columns), dev.metric, batch_size)
            self._score = self._scorer

    def encode_with(self, batch_size: int, precision: str) -> None:
        """Encode the dev sentences in batches of ``batch_size`` and, for a cselab encoder
        on its device, under the autocast of ``precision`` (``fp32``: none): the run plan's
        ``eval_batch_size`` and ``eval_precision``. A BEIR folder's texts are encoded through
        ``encode()`` in fp32 whatever ``precision`` says."""
        self.batch_size, self.precision = batch_size, precision
        if self._scorer is not None:
            self._scorer.batch_size = batch_size
        if isinstance(self._scorer, PairsScorer):
            self._scorer.precision = precision

    @classmethod
    def from_function(
        cls, score: Callable[[EncoderLike], float | dict[str, float]]
    ) -> DevEvaluator:
        """A user's own ``encoder -> score`` (or ``{name: score, ...}``), scored under the
        default name (``stsb_dev``) with no known source."""
        evaluator = cls.__new__(cls)
        evaluator.dev = DevSet(STSB, STSB, "dev", "spearman", dev_score_name(STSB), None)
        evaluator.data_dir, evaluator.batch_size, evaluator._score = None, BATCH_SIZE, score
        evaluator.precision, evaluator._scorer = "fp32", None  # the function encodes as it will
        return evaluator

    @property
    def name(self) -> str:
        """The score's column in ``metrics.csv`` and key in ``results.json``."""
        return self.dev.score_name

    @property
    def source(self) -> str | None:
        """The dev set as the logs name it."""
        return self.dev.label

    def __call__(self, encoder: EncoderLike) -> float | dict[str, float]:
        return self._score(encoder)

    def _stsb(self, encoder: EncoderLike) -> dict[str, float]:
        from .sts import ensure_stsb_dev, stsb_dev_measures

        # eval.dev is a training setting: a missing folder is named as `cselab train` takes it
        ensure_stsb_dev(self.data_dir, option="--eval.data_dir=DIR")
        # One encoding serves the score and alignment/uniformity (SimCSE Fig. 2).
        out = stsb_dev_measures(
            encoder, self.data_dir, self.batch_size, self._repeated, self.precision
        )
        return {self.name: out[self.dev.metric], "align": out["align"], "uniform": out["uniform"]}

    def _retrieval(self) -> Callable[[EncoderLike], dict[str, float]]:
        """``eval.dev`` a BEIR folder: the metric (x 100) of exact search on its split."""
        import logging

        from .retrieval import RetrievalScorer

        dev = self.dev
        if dev.split != "dev":
            logging.getLogger(__name__).warning(
                "eval.dev=%s has no qrels/dev.tsv; model selection uses its one split, %s",
                dev.path, dev.split,
            )  # fmt: skip
        scorer = RetrievalScorer(dev.path, dev.split, [dev.metric], batch_size=self.batch_size)
        self._scorer = scorer
        return lambda encoder: {self.name: scorer(encoder)[dev.metric]}


def dev_evaluator(
    dev: str,
    metric: str | None = "spearman",
    columns: Sequence[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int = BATCH_SIZE,
) -> DevEvaluator | None:
    """The :class:`DevEvaluator` of ``eval.dev`` (resolved by
    :func:`~cselab.config.devset.resolve_dev_set`), or ``None`` for ``none``.

    ``dev``: ``stsb`` (STS-B dev, as SimCSE), ``none`` (no selection), the path of an
    STS-format file / saved dataset, or a BEIR folder (scored on its ``dev`` qrels, else on its
    one split, named in the log; ``metric`` ``ndcg@10``, ``mrr@10``...: see
    :mod:`cselab.evaluation.retrieval`). The name is :func:`dev_score_name`'s; the value is the
    correlation or measure x 100.
    """
    resolved = resolve_dev_set(dev, metric, tuple(columns) if columns else None)
    return None if resolved is None else DevEvaluator(resolved, data_dir, batch_size)
