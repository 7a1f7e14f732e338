"""Paired statistics against references written from the definitions (t distribution by
numerical integration of its density, Wilcoxon by enumerating every sign pattern)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from cselab.insight.stats import MIN_SEEDS, paired_difference


def t_two_sided_p(t: float, dof: int, steps: int = 200_000) -> float:
    """2 * P(T > |t|) by Simpson's rule on the Student t density over [0, |t|]."""
    c = math.gamma((dof + 1) / 2) / (math.sqrt(dof * math.pi) * math.gamma(dof / 2))

    def f(x: float) -> float:
        return c * (1 + x * x / dof) ** (-(dof + 1) / 2)

    h = abs(t) / steps
    area = f(0) + f(abs(t)) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, steps))
    return 1 - 2 * area * h / 3


def wilcoxon_exact_p(d: list[float]) -> float:
    """Two-sided exact p: the share of the 2^n sign patterns whose W+ is as extreme."""
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    ranks = {i: r + 1 for r, i in enumerate(order)}  # no ties in the test data
    w = sum(ranks[i] for i in range(len(d)) if d[i] > 0)
    total = len(d) * (len(d) + 1) / 2
    extreme = min(w, total - w)
    count = 0
    for signs in itertools.product((0, 1), repeat=len(d)):
        wp = sum(ranks[i] for i in range(len(d)) if signs[i])
        count += min(wp, total - wp) <= extreme
    return count / 2 ** len(d)


def test_six_seeds_against_the_definitions() -> None:
    a = [80.1, 80.9, 79.7, 81.3, 80.2, 80.8]
    b = [79.6, 80.0, 79.9, 80.5, 79.9, 80.1]
    d = [x - y for x, y in zip(a, b, strict=True)]
    r = paired_difference(a, b, n_resamples=4000)
    n, mean, sd = len(d), statistics.fmean(d), statistics.stdev(d)
    t = mean / (sd / math.sqrt(n))
    assert r.n == 6 and not r.weak and MIN_SEEDS == 5
    assert r.mean == pytest.approx(mean, rel=1e-12) and r.std == pytest.approx(sd, rel=1e-12)
    assert r.t_p == pytest.approx(t_two_sided_p(t, n - 1), rel=1e-6)
    assert r.wilcoxon_p == pytest.approx(wilcoxon_exact_p(d), rel=1e-12)
    # the bootstrap interval lies within the range of the differences and around the mean
    assert min(d) <= r.bootstrap_ci[0] < mean < r.bootstrap_ci[1] <= max(d)
    # the t interval: the mean where the two-sided p equals 0.05
    half = (r.t_ci[1] - r.t_ci[0]) / 2
    assert r.t_ci[0] + half == pytest.approx(mean, rel=1e-9)
    assert t_two_sided_p(half / (sd / math.sqrt(n)), n - 1) == pytest.approx(0.05, rel=1e-5)


def test_degenerate_inputs() -> None:
    one = paired_difference([2.0], [1.0])
    assert one.n == 1 and one.mean == 1.0 and one.weak and math.isnan(one.t_p)
    same = paired_difference([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])  # every pair +1
    assert same.t_ci == same.bootstrap_ci == (1.0, 1.0) and same.std == 0.0
    zero = paired_difference([1.0, 2.0], [1.0, 2.0])
    assert math.isnan(zero.t_p) and math.isnan(zero.wilcoxon_p)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0, 2.0], [1.0])
