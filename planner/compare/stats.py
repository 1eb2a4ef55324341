"""Is a difference between two measured figures beyond the noise? Tested on the stored 95% intervals.

Results files keep each figure's estimate and its 95% interval (replay.stats.intervals), not the
requests behind them. Those intervals are already honest for correlated closed-loop samples:
they are built on the effective sample size n / tau. So the test works on them:

- The difference new - base gets a 95% interval by MOVER (Zou and Donner's "method of variance
  estimates recovery"): each side's distance to its own interval bound is its 1.96 standard
  errors on that side, and the two facing sides add in quadrature,
      lower = d - sqrt((new - new_lo)^2 + (base_hi - base)^2)
      upper = d + sqrt((new_hi - new)^2 + (base - base_lo)^2).
  The difference is significant at 5% when that interval excludes 0. Asking instead whether the
  two 95% intervals overlap would test at about 0.6%, far too blind; asking whether either
  estimate lies outside the other's interval would test near 17%, far too jumpy.
- The equivalent z = d / (that side's width / 1.96) gives a two-sided p-value, so that many
  figures compared at once keep a 5% chance of any false alarm in all (Holm's step-down
  correction over every figure of a comparison).
- A figure whose facing interval side is open (a p99 on too few requests) cannot be tested:
  inconclusive, never unchanged.

tests/unit/test_compare_stats.py measures the level and the power on correlated samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from replay.stats.intervals import Z_975

ALPHA = 0.05

Bounds = Sequence[float | None] | None


@dataclass(frozen=True)
class Test:
    # new - base, and its 95% interval by MOVER (None: that side open).
    difference: float
    lower: float | None
    upper: float | None
    p_value: float


def difference_test(base: float | None, base_ci: Bounds, new: float | None, new_ci: Bounds) -> Test | None:
    """The test of new - base on the two estimates and their 95% intervals; None when it cannot
    be done (a figure or a facing interval side missing)."""
    if base is None or new is None or not base_ci or not new_ci or len(base_ci) != 2 or len(new_ci) != 2:
        return None
    b_lo, b_hi = base_ci
    n_lo, n_hi = new_ci
    d = new - base
    # The sides that face each other in the direction of the difference decide its significance.
    up_side = (n_lo, b_hi) if d >= 0 else (n_hi, b_lo)
    if None in up_side:
        return None
    n_side, b_side = up_side
    width = math.hypot(new - n_side, b_side - base)
    low = None if n_lo is None or b_hi is None else d - math.hypot(new - n_lo, b_hi - base)
    high = None if n_hi is None or b_lo is None else d + math.hypot(n_hi - new, base - b_lo)
    if width <= 0:
        p = 0.0 if d != 0 else 1.0
    else:
        z = abs(d) / (width / Z_975)
        p = math.erfc(z / math.sqrt(2))
    return Test(difference=d, lower=low, upper=high, p_value=p)


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects, in the input order: the chance of
    any false rejection among them all stays at most alpha."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected
