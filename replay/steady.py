"""Where the steady state begins: MSER-5 truncation of a step's measured series.

The warm-up waits until the load is in flight, but queues and caches may still be settling when
the window opens. MSER-5 (White, 1997; a standard rule of simulation output analysis) averages the
series in batches of five and drops the first d batches, choosing the d (at most half the
batches) that minimises the standard error of what remains: sum((b_i - mean)^2) / (k - d)^2.
A transient at the start inflates that spread; dropping it lowers it more than the lost batches
raise it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BATCH = 5
# Too few batches to tell a transient from noise: drop nothing.
MIN_BATCHES = 8


def mser5(series: Sequence[float] | np.ndarray) -> int:
    """How many leading observations to drop."""
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
