"""The dev set of model selection (``eval.dev``), resolved once into a frozen :class:`DevSet`.

``eval.dev`` is a string (``stsb``, ``none``, an STS-format file, a BEIR folder) and
``eval.dev_metric`` may be null (the dev set's default). :func:`resolve_dev_set` reads the disk
once (is it a BEIR folder? which qrels split?) and says everything the run needs: the kind, the
metric, the score's name in ``metrics.csv`` and the label in the logs. Model selection
(:class:`~cselab.evaluation.custom.DevEvaluator`), the model card and the CLI read the DevSet,
never the string again. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.errors import ConfigError
from ..core.metrics import (  # STSB, DevKind: re-exported (``eval.dev`` for STS-B dev)
    DEV_CUTOFFS,
    RETRIEVAL_MEASURES,
    STS_DEV_METRICS,
    STSB,
    DevKind,
    dev_score_name,
    retrieval_metric,
)

#: ``eval.dev`` for no model selection
NO_DEV = "none"
#: The sentence 1, sentence 2 and score columns of an STS-format file where none are named
#: (``eval.dev_columns``, ``cselab evaluate --sts-columns``, :mod:`cselab.evaluation.custom`)
DEV_COLUMNS = ("sentence1", "sentence2", "score")


def check_sts_columns(columns: Sequence[str], what: str = "STS columns") -> tuple[str, str, str]:
    """``columns`` as the three distinct, non-empty names of an STS-format file's sentence 1,
    sentence 2 and score columns: the one rule of ``eval.dev_columns`` (checked when the config
    is read) and of the file's reader.

    Raises:
        ConfigError: naming ``what`` (``eval.dev_columns``) and the columns given.
    """
    cols = tuple(columns)
    if len(cols) != 3 or len(set(cols)) != 3 or not all(isinstance(c, str) and c for c in cols):
        raise ConfigError(
            f"{what} must be three distinct names (sentence 1, sentence 2, score), got {list(cols)}"
        )
    return cols  # type: ignore[return-value]


def dev_metric_for(dev: str, metric: str | None) -> str:
    """``eval.dev_metric`` checked against ``eval.dev`` (a BEIR folder takes a retrieval measure,
    STS pairs a correlation), in lower case (names are case-insensitive); ``None`` is
    ``ndcg@10`` for a BEIR folder, else ``spearman``.

    Raises:
        ConfigError: naming the key, the value and what ``dev`` takes instead.
    """
    from ..io.readers import is_beir_folder

    beir = dev.lower() not in (STSB, NO_DEV) and is_beir_folder(dev)
    if metric is None:
        return "ndcg@10" if beir else "spearman"
    measures = ", ".join(f"{m}@K" for m in RETRIEVAL_MEASURES)
    parsed = retrieval_metric(metric)
    # one rule for every name: case does not matter (Spearman, NDCG@10)
    if str(metric).lower() in STS_DEV_METRICS:
        if beir:
            raise ConfigError(
                f"eval.dev_metric={metric} is a correlation of STS pairs, but eval.dev={dev} is a "
                f"BEIR retrieval folder; use {measures}"
            )
        return str(metric).lower()
    if parsed is None:
        raise ConfigError(
            f"eval.dev_metric: unknown metric {metric!r}; expected spearman, pearson or (for a "
            f"BEIR eval.dev folder) {measures}"
        )
    if not beir:
        raise ConfigError(
            f"eval.dev_metric={metric} is a retrieval measure; eval.dev={dev} is not a BEIR folder "
            "(corpus.jsonl, queries.jsonl, qrels/); use spearman or pearson"
        )
    if parsed[1] not in DEV_CUTOFFS:
        raise ConfigError(
            f"eval.dev_metric={metric}: K must be one of {', '.join(map(str, DEV_CUTOFFS))}"
        )
    return f"{parsed[0]}@{parsed[1]}"


@dataclass(frozen=True)
class DevSet:
    """What model selection scores, resolved from ``eval.dev`` and ``eval.dev_metric``.

    Attributes:
        kind: ``stsb`` (STS-B dev, as SimCSE), ``sts-file`` (an STS-format file) or
            ``retrieval`` (a BEIR folder).
        path: ``stsb``, or the file or folder as written in the config.
        split: ``dev`` for STS-B, the qrels split of a BEIR folder (``dev``, else its one split),
            ``None`` for a file.
        metric: the metric, never null (``spearman``, ``pearson``, ``ndcg@10``, ...).
        score_name: its column in ``metrics.csv`` (:func:`~cselab.core.metrics.dev_score_name`).
        label: what the logs and ``results.json`` name as its source (``None``: not known, for
            a user's own scoring function).
        columns: the sentence 1, sentence 2 and score columns of a file (``None`` otherwise).
    """

    kind: DevKind
    path: str
    split: str | None
    metric: str
    score_name: str
    label: str | None
    columns: tuple[str, ...] | None = None


def resolve_dev_set(
    dev: str, metric: str | None = None, columns: list[str] | tuple[str, ...] | None = None
) -> DevSet | None:
    """The :class:`DevSet` of ``eval.dev`` / ``eval.dev_metric`` / ``eval.dev_columns``
    (``None`` for ``eval.dev: none``); the one place the default metric and a BEIR folder's split
    are read from disk.

    Raises:
        ConfigError: naming the key, as :func:`dev_metric_for`.
    """
    if dev.lower() == NO_DEV:
        return None
    metric = dev_metric_for(dev, metric)
    name = dev_score_name(dev, metric)
    if dev.lower() == STSB:
        return DevSet(STSB, STSB, "dev", metric, name, STSB)
    if retrieval_metric(metric) is not None:
        from ..io.readers import beir_splits

        splits = beir_splits(dev)
        split = "dev" if "dev" in splits or len(splits) != 1 else splits[0]
        return DevSet("retrieval", dev, split, metric, name, f"{dev} ({split})")
    return DevSet(
        "sts-file", dev, None, metric, name, str(dev), tuple(columns) if columns else None
    )


__all__ = [
    "DEV_COLUMNS",
    "NO_DEV",
    "STSB",
    "DevSet",
    "check_sts_columns",
    "dev_metric_for",
    "resolve_dev_set",
]
