"""The search for the highest concurrency that passes every SLO.

A pure function of the steps so far: exponential bracketing (double until a step fails or the
upper bound is reached), then bisection between the highest pass and the lowest failure, to a
precision of one request or 5%. Measurements are noisy, so a pass above a failure is ignored:
the answer is always the highest pass below the lowest failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Bracket:
    max_passing: int | None
    min_failing: int | None


def bracket(history: Sequence[tuple[int, bool]]) -> Bracket:
    fails = [c for c, passed in history if not passed]
    min_failing = min(fails) if fails else None
    passes = [c for c, passed in history if passed and (min_failing is None or c < min_failing)]
    return Bracket(max(passes) if passes else None, min_failing)


def converged(lo: int, hi: int, rel_precision: float) -> bool:
    return hi - lo <= 1 or (lo > 0 and (hi - lo) <= rel_precision * lo)


def next_probe(
    history: Sequence[tuple[int, bool]],
    *,
    start: int = 1,
    upper: int | None = None,
    rel_precision: float = 0.05,
) -> int | None:
    """The next concurrency to measure, or None when the search is done.

    `history` holds (concurrency, passed) for every step so far. `start` is the first probe;
    `upper` caps the search (a capacity bound): when it passes, nothing above it is tried.
    """
    if start < 1:
        raise ValueError("start must be >= 1")
    if upper is not None and upper < 1:
        raise ValueError("upper must be >= 1")
    if not history:
        return min(start, upper) if upper is not None else start
    b = bracket(history)
    lo = b.max_passing or 0
    if b.min_failing is None:
        if upper is not None and lo >= upper:
            return None
        nxt = lo * 2
        return min(nxt, upper) if upper is not None else nxt
    hi = b.min_failing
    if converged(lo, hi, rel_precision):
        return None
    mid = (lo + hi) // 2
    tried = {c for c, _ in history}
    if mid in tried or mid <= lo:
        return None
    return mid
