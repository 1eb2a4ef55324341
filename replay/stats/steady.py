"""Where the steady state begins: MSER-5 truncation of a step's measured series, kept only when
the head it would drop really differs from the rest.

The warm-up waits until the load is in flight, but queues and caches may still be settling when
the window opens. MSER-5 (White, 1997; a standard rule of simulation output analysis) averages the
series in batches of five and drops the first d batches, choosing the d (at most half the
batches) that minimises the standard error of what remains: sum((b_i - mean)^2) / (k - d)^2.
A transient at the start inflates that spread; dropping it lowers it more than the lost batches
raise it.

MSER alone also fires on a series that has no transient at all: a closed loop of mixed prompt
and output lengths is a steady mix of short and long requests, and a few long ones early in the
window make MSER drop up to half of it (measured on the CPU demo: 45 of 100 requests at
concurrency 24, 95 of 197 at 31), which doubles a window's cost for nothing. So the truncation is
kept only when the dropped head's mean stands apart from the rest's by more than `TREND_Z`
standard errors, the errors read from the spread of the rest's batch means (a two-sample test
on batch means): a real transient (a queue draining, a cache filling) does that; the request mix
does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BATCH = 5
# Too few batches to tell a transient from noise: drop nothing.
MIN_BATCHES = 8
# How far (in standard errors) the dropped head must sit from the rest to count as a transient.
TREND_Z = 3.0


def mser5(series: Sequence[float] | np.ndarray) -> int:
    """How many leading observations MSER-5 would drop."""
    arr = np.asarray(series, dtype=float)
    k = arr.size // BATCH
    if k < MIN_BATCHES:
        return 0
    batches = arr[: k * BATCH].reshape(k, BATCH).mean(axis=1)
    # Suffix sums give every candidate d's statistic at once.
    s1 = np.cumsum(batches[::-1])[::-1]
    s2 = np.cumsum((batches**2)[::-1])[::-1]
    remaining = np.arange(k, 0, -1, dtype=float)
    spread = s2 - s1**2 / remaining
    statistic = spread / remaining**2
    d = int(np.argmin(statistic[: k // 2 + 1]))
    return d * BATCH


def steady_start(series: Sequence[float] | np.ndarray) -> int:
    """How many leading observations to drop: MSER-5's choice when the head it drops is a real
    transient (see the module's docstring), else none."""
    arr = np.asarray(series, dtype=float)
    d = mser5(arr)
    if d == 0:
        return 0
    k = arr.size // BATCH
    # On a log scale: latencies are skewed, and one very long request in the head must not read
    # as a transient.
    logs = np.log(np.maximum(arr[: k * BATCH], np.finfo(float).tiny))
    batches = logs.reshape(k, BATCH).mean(axis=1)
    head, rest = batches[: d // BATCH], batches[d // BATCH :]
    if head.size < 1 or rest.size < 2:
        return 0
    # The rest's spread is the steady state's: the head's own spread includes the transient.
    se = math.sqrt(float(rest.var(ddof=1)) * (1 / head.size + 1 / rest.size))
    if se <= 0:
        return d if float(head.mean()) != float(rest.mean()) else 0
    return d if abs(float(head.mean()) - float(rest.mean())) > TREND_Z * se else 0
