"""Per-step latency and throughput figures, computed with numpy from request records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from replay.records import RequestRecord
from replay.results import LatencySummary
from replay.stats import intervals

PERCENTILES = (50, 90, 95, 99)


def summarize(values_ms: Sequence[float] | np.ndarray) -> LatencySummary:
    """mean, p50, p90, p95, p99 and max of a sample, with their 95% intervals; all None when the
    sample is empty. Give the values in arrival order: the intervals read its autocorrelation."""
    arr = np.asarray(values_ms, dtype=float)
    if arr.size == 0:
        return LatencySummary()
    # "linear" interpolation is numpy's default and what vLLM's own benchmark client reports.
    p50, p90, p95, p99 = np.percentile(arr, PERCENTILES)
    return LatencySummary(
        mean=float(arr.mean()),
        p50=float(p50),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
        max=float(arr.max()),
        ci95=intervals.latency_intervals(arr),
    )


def ttft_ms(records: Iterable[RequestRecord]) -> np.ndarray:
    return np.array([r.ttft_s * 1e3 for r in records if r.ok and r.ttft_s is not None], dtype=float)


def tpot_ms(records: Iterable[RequestRecord]) -> np.ndarray:
    """Time per output token after the first, per request (requests with at least two tokens)."""
    out = []
    for r in records:
        if not r.ok or r.first_token_s is None:
            continue
        n = r.completion_tokens if r.completion_tokens is not None else len(r.token_times_s)
        if n > 1:
            out.append((r.end_s - r.first_token_s) / (n - 1) * 1e3)
    return np.array(out, dtype=float)


def e2e_ms(records: Iterable[RequestRecord]) -> np.ndarray:
    return np.array([r.e2e_s * 1e3 for r in records if r.ok], dtype=float)


def lag_p99_ms(lags_s: Sequence[float]) -> float | None:
    if not lags_s:
        return None
    return float(np.percentile(np.asarray(lags_s, dtype=float), 99) * 1e3)
