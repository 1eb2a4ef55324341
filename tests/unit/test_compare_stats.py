"""The comparison's significance test (planner.compare.stats): its level and power on correlated
closed-loop-like samples, summarised exactly as a step summarises its requests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.compare.stats import difference_test, holm
from replay.stats import samples as stats

DRAWS = 200
REQUESTS = 400
# At a true level of 5%, 200 draws call a difference about 10 times (sd 3.1); 18 or more happen
# with probability 0.4%. So at most 17 false alarms: a test at 5% passes, one at 10% (20 expected)
# fails more often than not.
MAX_FALSE_ALARMS = 17
MIN_FOUND = 180  # 90% of 200


def latencies(rng: np.random.Generator, n: int, scale_ms: float, phi: float = 0.6, sigma: float = 0.3) -> np.ndarray:
    """Lognormal latencies whose log follows an AR(1) in arrival order: neighbours alike, as in a
    closed loop (tau = (1 + phi) / (1 - phi) = 4 at phi 0.6)."""
    noise = rng.normal(size=n)
    x = np.empty(n)
    x[0] = noise[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + math.sqrt(1 - phi**2) * noise[i]
    return scale_ms * np.exp(sigma * x)


def _called(rng: np.random.Generator, stat: str, slowdown: float) -> tuple[int, int]:
    """(draws called different, draws called slower) of DRAWS comparisons."""
    different = slower = 0
    for _ in range(DRAWS):
        a = stats.summarize(latencies(rng, REQUESTS, 20.0))
        b = stats.summarize(latencies(rng, REQUESTS, 20.0 * slowdown))
        test = difference_test(getattr(a, stat), a.ci95[stat], getattr(b, stat), b.ci95[stat])
        assert test is not None
        if test.p_value < 0.05:
            different += 1
            slower += test.difference > 0
    return different, slower


@pytest.mark.parametrize("stat", ["p50", "mean"])
def test_two_samples_of_the_same_law_are_called_different_in_at_most_about_5_percent(stat):
    different, _ = _called(np.random.default_rng(20), stat, 1.0)
    assert different <= MAX_FALSE_ALARMS


@pytest.mark.parametrize("stat", ["p50", "mean"])
def test_a_20_percent_slowdown_is_found_in_at_least_90_percent(stat):
    _, slower = _called(np.random.default_rng(21), stat, 1.2)
    assert slower >= MIN_FOUND


def test_ignoring_the_correlation_would_alarm_far_more_often():
    # The same samples with intervals as if the requests were independent (tau = 1): the test
    # is only honest because the stored intervals use the effective sample size.
    from replay.stats import intervals

    rng = np.random.default_rng(22)
    alarms = 0
    for _ in range(DRAWS):
        a, b = latencies(rng, REQUESTS, 20.0), latencies(rng, REQUESTS, 20.0)
        ci = [intervals.quantile_interval(x, 0.5, tau=1.0) for x in (a, b)]
        test = difference_test(float(np.quantile(a, 0.5)), ci[0], float(np.quantile(b, 0.5)), ci[1])
        alarms += test.p_value < 0.05
    assert alarms > 2 * MAX_FALSE_ALARMS


def test_an_open_facing_side_cannot_be_tested():
    assert difference_test(10.0, [9.0, None], 12.0, [11.0, 13.0]) is None
    assert difference_test(10.0, [9.0, 11.0], 12.0, [None, 13.0]) is None
    # The side away from the difference may be open.
    assert difference_test(10.0, [None, 11.0], 12.0, [11.5, None]) is not None
    assert difference_test(None, [9.0, 11.0], 12.0, [11.0, 13.0]) is None


def test_the_difference_interval_adds_the_facing_sides_in_quadrature():
    test = difference_test(10.0, [9.0, 13.0], 20.0, [16.0, 21.0])
    assert test.difference == 10.0
    assert test.lower == pytest.approx(10.0 - math.hypot(4.0, 3.0))
    assert test.upper == pytest.approx(10.0 + math.hypot(1.0, 1.0))
    # z = 10 / (5 / 1.96) = 3.92
    assert test.p_value == pytest.approx(math.erfc(3.92 / math.sqrt(2)), rel=1e-3)
    # Exactly at the edge: the facing sides just reach each other's estimate over sqrt(2).
    edge = difference_test(0.0, [-1.0, 1.0], math.sqrt(2), [math.sqrt(2) - 1.0, math.sqrt(2) + 1.0])
    assert edge.lower == pytest.approx(0.0, abs=1e-12) and edge.p_value == pytest.approx(0.05, rel=1e-3)


def test_holm_keeps_the_family_at_5_percent():
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]
    assert holm([0.001, 0.02, 0.04]) == [True, True, True]
    assert holm([0.2, 0.001]) == [False, True]
    assert holm([]) == []
