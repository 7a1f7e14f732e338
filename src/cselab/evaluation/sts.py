"""STS tasks without training: cosine similarity of the two sentence vectors vs the gold score.

Follows SentEval ``senteval/sts.py`` as modified in princeton-nlp/SimCSE ``SentEval/senteval/
sts.py`` (which adds the ``all`` setting and scores STS-B / SICK-R by cosine, not with a trained
regressor):

* STS12-16: per subset Pearson and Spearman over the pairs that have a gold score; ``mean`` and
  ``wmean`` (weighted by the number of pairs) of the per-subset values; ``all``: the
  correlation over the concatenation of the year's subsets (SimCSE's headline number).
* STS-B and SICK-R: Spearman (and Pearson) of cosine vs gold on one split (``test``; ``dev``
  for model selection).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from ..model.choices import BATCH_SIZE
from . import datasets
from .embed import EmbeddingCache, EncoderLike, RepeatedSentences, call_encoder

STS_YEARS = tuple(datasets.STS_YEARS)
SPLIT_TASKS = ("STSBenchmark", "SICKRelatedness")
STS_TASKS = (*STS_YEARS, *SPLIT_TASKS)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two ``(N, D)`` arrays, in float64, rounded to 12 decimals.

    Like SentEval's ``np.nan_to_num(cosine(np.nan_to_num(u), np.nan_to_num(v)))``: NaNs in the
    vectors become 0 and an undefined cosine (a zero vector) scores 0.
    """
    a = np.nan_to_num(np.asarray(a, dtype=np.float64))
    b = np.nan_to_num(np.asarray(b, dtype=np.float64))
    num = np.einsum("ij,ij->i", a, b)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.nan_to_num(num / den)
    # Identical sentences give identical vectors, whose cosine is 1 up to a few float ulps.
    # Rounding away that noise makes them exact ties for Spearman (STS12 has 79 such pairs);
    # SentEval's float32 cosines break those ties by rounding noise instead (docs/evaluation.md).
    return np.round(cos, 12)


def correlations(system: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman (scipy, as SentEval) of system scores vs gold; NaN if undefined."""
    system = np.asarray(system, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    n = int(len(gold))
    if n < 2:
        return {"pearson": float("nan"), "spearman": float("nan"), "n": n}
    with warnings.catch_warnings():
        # A constant input (e.g. a collapsed encoder) has no correlation: scipy warns and
        # returns NaN, which is the honest answer.
        warnings.simplefilter("ignore")
        pearson = float(stats.pearsonr(system, gold)[0])
        spearman = float(stats.spearmanr(system, gold)[0])
    return {"pearson": pearson, "spearman": spearman, "n": n}


def sts_aggregates(
    per_subset: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> dict[str, dict[str, float]]:
    """SentEval's ``mean`` / ``wmean`` and SimCSE's ``all`` from ``{subset: (system, gold)}``.

    ``mean``: plain average of the per-subset correlations; ``wmean``: average weighted by the
    subset sizes; ``all``: the correlation over all subsets' pairs concatenated.
    """
    results = {name: correlations(s, g) for name, (s, g) in per_subset.items()}
    weights = np.array([r["n"] for r in results.values()], dtype=np.float64)
    out: dict[str, dict[str, float]] = {"mean": {}, "wmean": {}}
    for metric in ("pearson", "spearman"):
        values = np.array([r[metric] for r in results.values()], dtype=np.float64)
        out["mean"][metric] = float(np.average(values))
        out["wmean"][metric] = float(np.average(values, weights=weights))
    system = np.concatenate([np.asarray(s, dtype=np.float64) for s, _ in per_subset.values()])
    gold = np.concatenate([np.asarray(g, dtype=np.float64) for _, g in per_subset.values()])
    out["all"] = correlations(system, gold)
    return out


def score_pairs(cache: EmbeddingCache, pairs: datasets.ScoredPairs) -> np.ndarray:
    """Cosine of each pair's two sentence vectors."""
    return cosine_similarity(cache.embed(pairs.sent1), cache.embed(pairs.sent2))


def sentences_of(tasks: Sequence[str], split: str, data_dir: Path) -> list[str]:
    """Every sentence the given STS tasks will encode (to encode them all in one pass)."""
    out: list[str] = []
    for task in tasks:
        for pairs in _pair_sets(task, split, data_dir).values():
            out.extend(pairs.sent1)
            out.extend(pairs.sent2)
    return out


def _pair_sets(task: str, split: str, data_dir: Path) -> dict[str, datasets.ScoredPairs]:
    if task in datasets.STS_YEARS:
        return datasets.load_sts_year(task, data_dir)
    if task == "STSBenchmark":
        return {split: datasets.load_stsb(split, data_dir)}
    if task == "SICKRelatedness":
        return {split: datasets.load_sick(split, data_dir)}
    raise ValueError(f"unknown STS task {task!r}; expected one of {', '.join(STS_TASKS)}")


def evaluate_sts_year(cache: EmbeddingCache, year: str, data_dir: Path) -> dict:
    """One year: ``{"subsets": {name: {pearson, spearman, n}}, "all", "mean", "wmean"}``."""
    per_subset = {
        name: (score_pairs(cache, pairs), pairs.scores)
        for name, pairs in datasets.load_sts_year(year, data_dir).items()
    }
    return {
        "subsets": {name: correlations(s, g) for name, (s, g) in per_subset.items()},
        **sts_aggregates(per_subset),
    }


def evaluate_split_task(cache: EmbeddingCache, task: str, split: str, data_dir: Path) -> dict:
    """STS-B or SICK-R on one split: ``{"split", "pearson", "spearman", "n"}``."""
    pairs = _pair_sets(task, split, data_dir)[split]
    return {"split": split, **correlations(score_pairs(cache, pairs), pairs.scores)}


def evaluate_sts(
    cache: EmbeddingCache, tasks: Sequence[str], split: str, data_dir: Path
) -> dict[str, dict]:
    """Run STS tasks; every distinct sentence of all of them is encoded once, up front.

    ``split`` (``test`` or ``dev``) applies to STS-B and SICK-R; STS12-16 only have a test set.
    """
    cache.add(sentences_of(tasks, split, data_dir))
    out: dict[str, dict] = {}
    for task in tasks:
        if task in datasets.STS_YEARS:
            out[task] = evaluate_sts_year(cache, task, data_dir)
        else:
            out[task] = evaluate_split_task(cache, task, split, data_dir)
    return out


# --------------------------------------------------------------------------------------------
# STS-B dev for the trainer's model selection


_STSB_DEV = datasets.stsb_file("dev")


def _stsb_dev_plan(data_dir: Path) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Distinct STS-B dev sentences (longest first) and each pair's two row indices."""
    path = data_dir / _STSB_DEV

    def build() -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        pairs = datasets.load_stsb("dev", data_dir)
        unique = sorted(dict.fromkeys(pairs.sent1 + pairs.sent2), key=len, reverse=True)
        index = {s: i for i, s in enumerate(unique)}
        i1 = np.array([index[s] for s in pairs.sent1], dtype=np.int64)
        i2 = np.array([index[s] for s in pairs.sent2], dtype=np.int64)
        return unique, i1, i2, pairs.scores

    return datasets._cached("stsb-dev-plan", (path,), build)


def ensure_stsb_dev(
    data_dir: str | os.PathLike[str] | None = None, option: str | None = None
) -> Path:
    """The data folder holding STS-B dev, downloaded into the cache if missing there; else
    :class:`~cselab.core.errors.MissingDataError` naming ``option`` as the way to another one."""
    root = datasets.resolve_data_dir(data_dir)
    if not (root / _STSB_DEV).is_file():
        from .download import ensure_files

        ensure_files([_STSB_DEV], root, option=option)
    return root


def stsb_dev_measures(
    encoder: EncoderLike,
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int = BATCH_SIZE,
    repeated: RepeatedSentences | None = None,
    precision: str = "fp32",
) -> dict[str, float]:
    """One encoding of STS-B dev, every number training looks at: ``spearman`` and ``pearson``
    (cosine vs gold, x 100; ``spearman`` is SimCSE's ``eval_stsb_spearman`` x 100) and
    ``align`` / ``uniform`` (Wang & Isola 2020, as SimCSE Sec. 5 computes them: alignment over
    the pairs with gold > 4, uniformity over the distinct sentences, t = 2, normalised vectors;
    the same definitions as :func:`cselab.evaluation.alignment.align_uniform`).

    ``encoder``: an object with ``encode(list[str], batch_size=...)`` or a plain callable
    ``list[str] -> (N, D) array``. The file is parsed once per process; each call encodes the
    distinct sentences once. An ``nn.Module`` encoder is put in eval mode for the call and its
    train/eval state restored afterwards. ``repeated``: the sentences tokenised once and kept
    on the device across calls (:class:`~cselab.evaluation.embed.RepeatedSentences`, the
    trainer's evaluator), the same numbers; ``precision`` (with ``repeated``): the autocast a
    cselab encoder runs under (the run plan's ``eval_precision``).
    """
    from .alignment import POSITIVE_THRESHOLD, alignment, l2_normalize, uniformity

    root = ensure_stsb_dev(data_dir)
    unique, i1, i2, gold = _stsb_dev_plan(root)
    if repeated is None:
        kept = vectors = call_encoder(encoder, list(unique), batch_size)
    else:  # the N x N uniformity where the vectors are: a GPU's, not the host's float64
        kept = repeated(encoder, unique, batch_size, on_device=True, precision=precision)
        vectors = kept if isinstance(kept, np.ndarray) else kept.cpu().numpy()
    corr = correlations(cosine_similarity(vectors[i1], vectors[i2]), gold)
    unit = l2_normalize(kept)
    positive = gold > POSITIVE_THRESHOLD
    return {
        "spearman": 100.0 * corr["spearman"],
        "pearson": 100.0 * corr["pearson"],
        "align": alignment(unit[i1[positive]], unit[i2[positive]]),
        "uniform": uniformity(unit),
    }


def stsb_dev_spearman(
    encoder: EncoderLike,
    data_dir: str | os.PathLike[str] | None = None,
    batch_size: int = BATCH_SIZE,
) -> float:
    """Spearman x 100 of cosine vs gold on STS-B dev (SimCSE's ``eval_stsb_spearman`` x 100);
    see :func:`stsb_dev_measures`."""
    return stsb_dev_measures(encoder, data_dir, batch_size)["spearman"]
