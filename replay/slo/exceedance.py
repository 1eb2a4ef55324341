"""The test that passed a percentile rule, kept beside its verdict.

A rule that passed while its interval is open above (a p99 on fewer requests than a finite upper
bound needs) passed on the order-statistic test (replay.stats.intervals.quantile_versus_bound): few
enough of the n requests exceeded the bound. `exceedance_test` records that count and the most
the test allows, so that a report can say why "pass" stands beside "[24.7, ?]".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from replay.results import SloExceedance
from replay.stats import intervals


def exceedance_test(values: Sequence[float] | np.ndarray, q: float, bound: float) -> SloExceedance | None:
    """How many of the n values exceeded `bound`, and the most that the order-statistic test
    (intervals.quantile_versus_bound) lets exceed it for the q-quantile to pass. None for an empty
    sample, or when no count passes (a sample too small for the test)."""
    arr = np.asarray(values, dtype=float)
    n = arr.size
    if n == 0:
        return None
    hits = arr <= bound
    n_eff = intervals.effective_size(n, intervals.autocorrelation_time(hits.astype(float)))
    _, hi_rank = intervals.order_statistic_ranks(n_eff, q)
    if hi_rank is None:
        return None
    needed = min(n, math.ceil(hi_rank * n / n_eff))
    return SloExceedance(exceeded=int(n - hits.sum()), n=int(n), allowed=int(n - needed), effective_n=int(n_eff))


def exceedance_tests(
    samples: Mapping[str, Sequence[float]], slo: Mapping[str, float], rule_verdicts: Mapping[str, str]
) -> dict[str, SloExceedance]:
    """The exceedance test of every client-side percentile rule that passed."""
    out: dict[str, SloExceedance] = {}
    for key, verdict in rule_verdicts.items():
        parts = key.split("_")
        if verdict != "pass" or len(parts) != 3 or parts[2] != "ms" or parts[1] not in intervals.QUANTILES:
            continue
        values = samples.get(parts[0])
        if values is None:
            continue
        test = exceedance_test(values, intervals.QUANTILES[parts[1]], slo[key])
        if test is not None:
            out[key] = test
    return out


def exceedance_text(test: SloExceedance) -> str:
    """`3 of 13 above the bound (at most 4 allowed)`."""
    return f"{test.exceeded} of {test.n} above the bound (at most {test.allowed} allowed)"
