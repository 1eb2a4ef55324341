"""The 95% intervals: coverage on correlated samples with a known quantile, and their edges."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay.stats import intervals

SIGMA = 0.5
Z = {0.5: 0.0, 0.9: 1.2815515655446004, 0.99: 2.3263478740408408}


def ar1_lognormal(n: int, phi: float, rng: np.random.Generator) -> np.ndarray:
    """exp(SIGMA * z) with z a unit-variance AR(1): its q-quantile is exp(SIGMA * z_q)."""
    e = rng.standard_normal(n) * math.sqrt(1 - phi * phi)
    z = np.empty(n)
    z[0] = rng.standard_normal()
    for i in range(1, n):
        z[i] = phi * z[i - 1] + e[i]
    return np.exp(SIGMA * z)


def naive_iid_interval(x: np.ndarray, q: float):
    return intervals.quantile_interval(x, q, tau=1.0)


def coverage(method, *, n: int, phi: float, draws: int = 200, seed: int = 7) -> dict[float, tuple[float, int]]:
    rng = np.random.default_rng(seed)
    hits = {q: 0 for q in Z}
    finite = {q: 0 for q in Z}
    for _ in range(draws):
        x = ar1_lognormal(n, phi, rng)
        for q, z in Z.items():
            lo, hi = method(x, q)
            if lo is None or hi is None:
                continue
            finite[q] += 1
            hits[q] += lo <= math.exp(SIGMA * z) <= hi
    return {q: (hits[q] / finite[q] if finite[q] else float("nan"), finite[q]) for q in Z}


@pytest.mark.timeout(60)
def test_the_interval_covers_the_true_percentile_of_a_correlated_series():
    # AR(1) with phi 0.8: neighbouring requests alike, as in a closed loop; 3,000 requests.
    result = coverage(intervals.quantile_interval, n=3000, phi=0.8)
    for q, (rate, finite) in result.items():
        assert finite >= 150, f"p{q * 100:g}: finite in only {finite} of 200 draws"
        assert rate >= 0.90, f"p{q * 100:g}: covered in {rate:.1%} of {finite} draws"


@pytest.mark.timeout(60)
def test_an_iid_interval_undercovers_the_same_series():
    # The same draws with autocorrelation ignored: the test above would fail for this method.
    result = coverage(naive_iid_interval, n=3000, phi=0.8)
    assert result[0.5][0] < 0.8 and result[0.9][0] < 0.8


@pytest.mark.timeout(60)
def test_independent_samples_are_covered_too_and_intervals_shrink_with_n():
    result = coverage(intervals.quantile_interval, n=1000, phi=0.0, draws=100)
    assert all(rate >= 0.9 for rate, _ in result.values())
    rng = np.random.default_rng(3)
    widths = []
    for n in (400, 1600, 6400):
        lo, hi = intervals.quantile_interval(ar1_lognormal(n, 0.5, rng), 0.9)
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_ranks_match_the_binomial_law():
    # n = 100, median: the classic ranks 40 and 61 (P >= 97.5% on each side).
    assert intervals.order_statistic_ranks(100, 0.5) == (40, 61)
    # 0.99^367 > 2.5% > 0.99^368: the first sample size with a finite p99 upper bound.
    assert intervals.min_sample_for(0.99) == 368
    assert intervals.order_statistic_ranks(367, 0.99)[1] is None
    assert intervals.order_statistic_ranks(368, 0.99)[1] == 368


def test_small_samples_give_open_sides():
    lo, hi = intervals.quantile_interval(np.arange(100.0), 0.99)
    assert lo is not None and hi is None
    assert intervals.quantile_interval([], 0.5) == (None, None)
    assert intervals.latency_intervals([]) is None
    assert intervals.latency_intervals([5.0])["p50"] == [None, None]


def test_mean_proportion_and_rate_intervals():
    rng = np.random.default_rng(1)
    x = rng.normal(10, 2, 2000)
    lo, hi = intervals.mean_interval(x)
    assert lo < 10 < hi and hi - lo < 0.5
    lo, hi = intervals.proportion_interval(rng.random(2000) < 0.9)
    assert lo < 0.9 < hi and 0 <= lo and hi <= 1
    assert intervals.proportion_interval([True] * 50)[1] == 1.0
    # 50 requests/s for 20 s, evenly: a narrow interval around 50.
    ends = np.arange(0, 20, 0.02)
    lo, hi = intervals.rate_interval(ends, np.ones(ends.size), 0.0, 20.0)
    assert lo <= 50 <= hi and hi - lo < 1
    assert intervals.rate_interval([1.0], [1.0], 0.0, 2.0) == (None, None)


def test_an_interval_always_holds_its_own_estimate():
    # A CI run plotted an unresolved step's p99 of two requests whose lower bound (the larger
    # value) lay above the interpolated estimate: matplotlib refused the negative error bar.
    assert intervals.quantile_interval([10.0, 20.0], 0.99)[0] <= float(np.quantile([10.0, 20.0], 0.99))
    rng = np.random.default_rng(7)
    for n in (2, 3, 5, 13, 40, 200):
        for _ in range(50):
            samples = [rng.lognormal(size=n), np.cumsum(rng.normal(size=n))]  # iid, and correlated
            for values in samples:
                for name, q in intervals.QUANTILES.items():
                    lo, hi = intervals.quantile_interval(values, q)
                    estimate = float(np.quantile(values, q))
                    assert lo is None or lo <= estimate, (n, name, lo, estimate)
                    assert hi is None or hi >= estimate, (n, name, hi, estimate)
