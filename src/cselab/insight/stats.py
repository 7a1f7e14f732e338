"""Paired comparisons of two configurations over seeds: confidence intervals and p-values.

Two configurations trained with the same seed share the batch order, the head's initialisation
and the dropout stream, so their difference *per seed* removes most of the seed-to-seed spread
(see ``docs/results/objectives_benchmark.md``). This module summarises those paired differences
with :mod:`scipy.stats`: a 95% confidence interval for the mean difference by the paired t
distribution and by a percentile bootstrap, and two-sided p-values of the paired t-test and of the
Wilcoxon signed-rank test. With fewer than :data:`MIN_SEEDS` pairs both tests are weak (the exact
Wilcoxon p-value of 3 pairs cannot go below 0.25), and the result says so.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

#: below this many paired seeds a comparison is flagged as weak
MIN_SEEDS = 5


@dataclass(frozen=True)
class PairedDifference:
    """Summary of ``a - b`` over ``n`` paired seeds.

    Attributes:
        n: number of pairs.
        mean: mean difference.
        std: sample standard deviation of the differences (``nan`` for one pair).
        t_ci: confidence interval of the mean by the paired t distribution (``n - 1`` d.o.f.).
        bootstrap_ci: percentile-bootstrap confidence interval of the mean.
        t_p: two-sided p-value of the paired t-test (``scipy.stats.ttest_rel``).
        wilcoxon_p: two-sided p-value of the Wilcoxon signed-rank test (``scipy.stats.wilcoxon``;
            exact for small ``n``, ``nan`` when every difference is zero).
        weak: ``n < MIN_SEEDS``: too few seeds for either test to mean much.
        confidence: the level of both intervals.
    """

    n: int
    mean: float
    std: float
    t_ci: tuple[float, float]
    bootstrap_ci: tuple[float, float]
    t_p: float
    wilcoxon_p: float
    weak: bool
    confidence: float

    def to_dict(self) -> dict[str, float | int | bool]:
        d = asdict(self)
        d["t_ci_low"], d["t_ci_high"] = d.pop("t_ci")
        d["bootstrap_ci_low"], d["bootstrap_ci_high"] = d.pop("bootstrap_ci")
        return d


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> PairedDifference:
    """Compare paired samples ``a[i]`` and ``b[i]`` (the same seed ``i``), as ``a - b``.

    Raises:
        ValueError: the samples differ in length or hold no pair.
    """
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length ({len(a)} and {len(b)})")
    if not a:
        raise ValueError("no pair to compare")
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    d = x - y
    n = len(d)
    mean = float(d.mean())
    nan = math.nan
    if n == 1:
        return PairedDifference(1, mean, nan, (nan, nan), (nan, nan), nan, nan, True, confidence)
    std = statistics.stdev(d.tolist())
    if std == 0.0:
        # every pair differs by the same amount: no spread to build an interval or a test from
        t_ci = boot_ci = (mean, mean)
        t_p = nan if mean == 0 else 0.0
    else:
        t = stats.ttest_rel(x, y)
        ci = t.confidence_interval(confidence_level=confidence)
        t_ci = (float(ci.low), float(ci.high))
        t_p = float(t.pvalue)
        kwargs = {
            "confidence_level": confidence,
            "n_resamples": n_resamples,
            "method": "percentile",  # BCa's jackknife is degenerate for the 3-5 seeds of a sweep
        }
        try:
            boot = stats.bootstrap((d,), np.mean, rng=np.random.default_rng(seed), **kwargs)
        except TypeError:  # scipy < 1.15 names the generator random_state
            boot = stats.bootstrap(
                (d,), np.mean, random_state=np.random.default_rng(seed), **kwargs
            )
        boot_ci = (float(boot.confidence_interval.low), float(boot.confidence_interval.high))
    if np.all(d == 0):
        wilcoxon_p = nan
    else:
        with warnings.catch_warnings():  # scipy warns that small samples have little power
            warnings.simplefilter("ignore")
            wilcoxon_p = float(stats.wilcoxon(x, y).pvalue)
    return PairedDifference(n, mean, std, t_ci, boot_ci, t_p, wilcoxon_p, n < MIN_SEEDS, confidence)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``nan`` for a single value)."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else math.nan
