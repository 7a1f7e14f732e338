"""Clustering: k-means on a user's labelled sentences, scored by the V-measure against the labels.

MTEB's clustering protocol (Muennighoff et al. 2023, "MTEB", §3.2 Clustering): encode the
sentences, cluster the vectors with k-means, ``k`` the number of distinct labels, and compare
the clusters with the labels by the V-measure (Rosenberg & Hirschberg 2007, "V-Measure", §4:
the harmonic mean of homogeneity ``h = 1 - H(C|K) / H(C)`` and completeness
``c = 1 - H(K|C) / H(K)``, each 1 when its entropy in the denominator is 0). The vectors are
L2-normalised first (the cosine geometry of every other cselab task); k-means is scipy's
``kmeans2`` with k-means++ seeding, and the score is the mean over :data:`RUNS` seeds, since
one run depends on its start.

The file is a table (``.tsv``/``.csv`` with a header, ``.jsonl``, a saved dataset) with a
``text`` and a ``label`` column, read by :mod:`cselab.io.readers`' rules
(``cselab evaluate --clustering FILE``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..io.readers import open_table
from .datasets import DataFormatError, MissingDataError
from .names import CLUSTERING_HINT
from .tasks import Row, TaskKind, TaskResult, TaskRun, hub_split, own_rows

#: ``"kind"`` of a clustering result entry (and the key of its headline table)
KIND = "clustering"
#: The text and label columns of a clustering file
COLUMNS = ("text", "label")
#: k-means runs (seeds 0..RUNS-1) whose V-measures are averaged
RUNS = 5


@dataclass(frozen=True)
class LabelledTexts:
    """A clustering file's sentences and their labels."""

    name: str
    texts: tuple[str, ...]
    labels: tuple[str, ...]
    path: Path


def read_labelled_file(
    path: str | os.PathLike[str], columns: Sequence[str] = COLUMNS
) -> LabelledTexts:
    """The ``text`` and ``label`` of every row of ``path``; a file with fewer than two labels,
    or no more rows than labels, has nothing to cluster and is refused."""
    p = Path(path)
    if not p.exists():
        raise MissingDataError(f"{p}: clustering file not found")
    text, label = columns
    table = open_table(p)
    table.require((text, label), "name the columns text and label")
    rows = [(row.text(text), row.key(label)) for row in table]  # a label may be an int
    labels = tuple(r[1] for r in rows)
    if len(set(labels)) < 2 or len(rows) <= len(set(labels)):
        raise DataFormatError(
            p, None, f"{len(rows)} rows with {len(set(labels))} labels: clustering needs at "
            "least two labels and more rows than labels",
        )  # fmt: skip
    return LabelledTexts(p.name, tuple(r[0] for r in rows), labels, p)


def v_measure(labels: Sequence[Any], clusters: Sequence[Any]) -> float:
    """The V-measure of ``clusters`` against the classes ``labels`` (Rosenberg & Hirschberg
    2007, Eq. 1-5 with beta 1), from the contingency table of their counts."""
    _, c = np.unique(np.asarray(labels), return_inverse=True)
    _, k = np.unique(np.asarray(clusters), return_inverse=True)
    n = len(c)
    table = np.zeros((c.max() + 1, k.max() + 1))
    np.add.at(table, (c, k), 1.0)

    def entropy(counts: np.ndarray) -> float:
        p = counts[counts > 0] / n
        return float(-(p * np.log(p)).sum())

    def conditional(table: np.ndarray) -> float:  # H(rows | columns)
        nz = table > 0
        given = np.broadcast_to(table.sum(axis=0, keepdims=True), table.shape)
        return float(-(table[nz] / n * np.log(table[nz] / given[nz])).sum())

    h_c, h_k = entropy(table.sum(axis=1)), entropy(table.sum(axis=0))
    homogeneity = 1.0 if h_c == 0 else 1.0 - conditional(table) / h_c
    completeness = 1.0 if h_k == 0 else 1.0 - conditional(table.T) / h_k
    total = homogeneity + completeness
    return 0.0 if total == 0 else 2.0 * homogeneity * completeness / total


def evaluate_clustering(vectors: np.ndarray, labels: Sequence[str]) -> dict[str, Any]:
    """``{"kind", "v_measure", "n", "clusters", "runs"}``: the mean V-measure of :data:`RUNS`
    k-means runs on the L2-normalised ``vectors``, ``k`` the number of distinct ``labels``."""
    from scipy.cluster.vq import kmeans2

    x = np.asarray(vectors, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    k = len(set(labels))
    scores = []
    for seed in range(RUNS):
        with warnings.catch_warnings():  # an empty cluster is a worse score, not an error
            warnings.simplefilter("ignore")
            _, assigned = kmeans2(x, k, minit="++", seed=seed)
        scores.append(v_measure(labels, assigned))
    return {
        "kind": KIND, "v_measure": float(np.mean(scores)), "n": len(labels),
        "clusters": k, "runs": RUNS,
    }  # fmt: skip


@dataclass(frozen=True)
class ClusteringTask(TaskKind):
    """k-means clustering of a user's labelled sentences, scored by the V-measure and reported
    under the file's name (with its path when two files share a name)."""

    texts: LabelledTexts
    kind: ClassVar[str] = KIND
    headline: ClassVar[str | None] = KIND
    panel: ClassVar[tuple[str, str] | None] = ("Your clustering files", "V-measure x 100")
    own_data: ClassVar[bool] = True
    data_hint: ClassVar[str | None] = CLUSTERING_HINT

    @property
    def label(self) -> str:
        return str(self.texts.path)

    @property
    def senteval_names(self) -> tuple[str, ...]:
        return ()

    def weight(self, root: Path | None) -> float:
        return float(sum(map(len, self.texts.texts)))

    def run(self, run: TaskRun) -> TaskResult:
        t = self.texts
        name = t.name if t.name not in run.taken else f"{t.name} ({t.path})"
        result = evaluate_clustering(run.cache.embed(list(t.texts)), t.labels)
        return TaskResult({name: {**result, "path": str(t.path)}}, name)

    @classmethod
    def headline_row(cls, results: Mapping[str, Any], dev: bool) -> Row | None:
        return own_rows(results, cls.kind, "v_measure") or None

    @classmethod
    def title(cls, mode: str) -> str:
        return "Your clustering files: V-measure x 100 of k-means vs labels"

    @classmethod
    def hub_results(cls, out: Mapping[str, Any], table: Mapping[str, Row]) -> list[dict[str, Any]]:
        return [
            {
                "task_type": "clustering",
                "task_name": "Clustering",
                "dataset_type": name,
                "dataset_name": f"{name} (own labelled sentences)",
                "dataset_split": hub_split("test"),
                "metric_type": "v_measure",
                "metric_name": "V-measure x 100",
                "metric_value": value,
            }  # fmt: skip
            for name, value in table.get(cls.headline or "", {}).items()
            if value is not None
        ]
