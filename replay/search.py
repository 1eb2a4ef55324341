"""The search for the highest concurrency that passes every SLO.

A pure function of the steps so far: exponential bracketing (double until a step fails or the
upper bound is reached), then bisection between the highest pass and the lowest failure, to a
precision of one request or 5%. Measurements are noisy, so a pass above a failure is ignored:
the answer is always the highest pass below the lowest failure. A step whose verdict was
inconclusive is recorded as a failure, so the answer never rests on a step that did not pass.

With `confirm`, the highest pass is measured once more before the search ends (the step runner
takes fresh prompts); if the repeat does not pass, that concurrency now counts as failing, and
the search goes on below it and confirms again.
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
    confirm: bool = False,
) -> int | None:
    """The next concurrency to measure, or None when the search is done.

    `history` holds (concurrency, passed) for every step so far. `start` is the first probe;
    `upper` caps the search (a capacity bound): when it passes, nothing above it is tried.
    `confirm`: end only once the highest pass has passed twice.
    """
    if start < 1:
        raise ValueError("start must be >= 1")
    if upper is not None and upper < 1:
        raise ValueError("upper must be >= 1")
    if not history:
        return min(start, upper) if upper is not None else start
    nxt = _bisect(history, upper, rel_precision)
    if nxt is not None or not confirm:
        return nxt
    lo = bracket(history).max_passing
    if lo is not None and not is_confirmed(history, lo):
        return lo
    return None


def is_confirmed(history: Sequence[tuple[int, bool]], concurrency: int) -> bool:
    return sum(1 for c, passed in history if c == concurrency and passed) >= 2


def _bisect(history: Sequence[tuple[int, bool]], upper: int | None, rel_precision: float) -> int | None:
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


def knee_interval(verdicts: Sequence[tuple[int, str]]) -> list[int | None]:
    """[highest conclusive pass, lowest conclusive fail] from (concurrency, verdict) pairs. A pass
    counts only below every step that did not pass (a fail, an inconclusive window, a knee
    confirmation that did not hold): above one, a pass is noise, as it is for the search."""
    fails = [c for c, v in verdicts if v == "fail"]
    not_passed = [c for c, v in verdicts if v != "pass"]
    below = min(not_passed) if not_passed else None
    passes = [c for c, v in verdicts if v == "pass" and (below is None or c < below)]
    return [max(passes) if passes else None, min(fails) if fails else None]
