"""How long the rest of a search will take: each step's expected wall time from the request
duration its warm-up measured, and the steps the search still needs.

A closed-loop step at concurrency c whose requests last D seconds takes about
D (warm-up: one request per slot) + D + min_requests x D / c (the window) + D (the drain). The
search needs about log2 of its bracket over the precision more steps, plus the confirmation. The
figures are estimates and are labelled so; the step's own window limit bounds the real time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from replay.results import StepResult
from replay.search.policy import Probe, bracket, is_confirmed

# Steps a search needs once it has a bracket but no model yet, and before it has any step.
UNBRACKETED_STEPS = 4


def step_wall_s(concurrency: int, duration_s: float, min_requests: int) -> float:
    """Expected wall time of one closed-loop step (warm-up, window, drain)."""
    return 3 * duration_s + min_requests * duration_s / max(concurrency, 1)


def duration_at(steps: Sequence[StepResult], concurrency: int) -> float | None:
    """The request duration the nearest measured concurrency's warm-up saw."""
    known = [
        (abs(int(s.load.value) - concurrency), s.request_duration_s)
        for s in steps
        if s.load.mode == "concurrency" and s.request_duration_s
    ]
    return min(known)[1] if known else None


def steps_left(history: Sequence[Probe], *, rel_precision: float, confirm: bool) -> int:
    b = bracket(history)
    confirming = 1 if confirm and not (b.max_passing is not None and is_confirmed(history, b.max_passing)) else 0
    if b.min_failing is None or b.max_passing is None:
        return UNBRACKETED_STEPS + confirming
    lo, hi = b.max_passing, b.min_failing
    resolution = max(1.0, rel_precision * lo)
    return max(0, math.ceil(math.log2(max(1.0, (hi - lo) / resolution)))) + confirming


def search_eta_s(
    steps: Sequence[StepResult],
    history: Sequence[Probe],
    next_concurrency: int,
    *,
    min_requests: int,
    rel_precision: float,
    confirm: bool,
) -> float | None:
    """Expected seconds until the search ends, None before any step measured a duration."""
    duration = duration_at(steps, next_concurrency)
    if duration is None:
        return None
    left = max(1, steps_left(history, rel_precision=rel_precision, confirm=confirm))
    return left * step_wall_s(next_concurrency, duration, min_requests)
