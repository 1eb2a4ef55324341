"""95% confidence intervals that stay honest when consecutive requests are correlated.

A closed loop makes neighbouring requests alike (they share a batch, a queue, a prefill burst), so
a sample of n requests carries less information than n independent ones. Every interval here
shrinks n to an effective size n_eff = n / tau, where tau is the integrated autocorrelation time
of the series in arrival order (Geyer's initial positive sequence: lags are summed until the
first non-positive autocorrelation).

- Percentiles: distribution-free binomial order-statistic bounds. The number of requests at or
  below the true q-quantile is Binomial(n_eff, q); the ranks that hold it with 97.5% on each side
  are mapped back to the full sorted sample. tau is that of the indicator series 1[x <= q_hat],
  the series whose count the binomial describes. A side is None when it would need a rank
  outside the sample (a p99 upper bound needs 368 independent requests).
- Means: normal interval with n_eff from the series itself.
- Fractions (SLO attainment): Wilson score interval on n_eff.
- Rates (requests/s, tokens/s): non-overlapping batch means over 10 equal slices of the window,
  with Student's t on 9 degrees of freedom.

numpy only: the binomial CDF is a cumulative sum in log space, t and z are constants.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
_ALPHA_SIDE = (1 - CONFIDENCE) / 2
Z_975 = 1.959963984540054
# Student's t, 97.5% quantile, 9 degrees of freedom (10 batches).
T_975_9 = 2.2621571627409915
RATE_BATCHES = 10
QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}

Bounds = tuple[float | None, float | None]


def autocorrelation_time(series: np.ndarray) -> float:
    """tau = 1 + 2 * sum of autocorrelations up to the first non-positive lag (>= 1)."""
    n = series.size
    if n < 4:
        return 1.0
    x = series - series.mean()
    var = float(x @ x) / n
    if var <= 0:
        return 1.0
    spectrum = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[: n // 4] / n / var
    positive_run = np.argmax(acf[1:] <= 0) if np.any(acf[1:] <= 0) else acf.size - 1
    return max(1.0, 1.0 + 2.0 * float(acf[1 : 1 + positive_run].sum()))


def effective_size(n: int, tau: float) -> int:
    return max(1, int(n / max(tau, 1.0)))


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(K <= k) for k = 0..n, K ~ Binomial(n, p), 0 < p < 1."""
    k = np.arange(n, dtype=float)
    log_first = n * math.log1p(-p)
    log_pmf = np.concatenate(([log_first], log_first + np.cumsum(np.log((n - k) / (k + 1)) + math.log(p / (1 - p)))))
    pmf = np.exp(log_pmf - log_pmf.max())
    return np.cumsum(pmf / pmf.sum())


def order_statistic_ranks(n: int, q: float) -> tuple[int | None, int | None]:
    """1-based ranks (lower, upper) of a sample of n iid values that bracket the q-quantile with
    at least 97.5% each; None where no rank in 1..n does."""
    cdf = _binomial_cdf(n, q)
    # Upper rank u: P(X_(u) < xi_q) = P(K >= u) <= alpha/2, the smallest such u.
    u = int(np.searchsorted(cdf, 1 - _ALPHA_SIDE)) + 1
    # Lower rank l: P(X_(l) > xi_q) = P(K <= l - 1) <= alpha/2, the largest such l.
    l = int(np.searchsorted(cdf, _ALPHA_SIDE, side="right"))
    return (l if l >= 1 else None), (u if u <= n else None)


def min_sample_for(q: float) -> int:
    """Independent requests a finite 97.5% upper bound on the q-quantile needs: q^n <= 2.5%."""
    return math.ceil(math.log(_ALPHA_SIDE) / math.log(q))


def quantile_tau(arr: np.ndarray, q: float) -> float:
    return autocorrelation_time((arr <= np.quantile(arr, q)).astype(float))


def quantile_interval(values: Sequence[float] | np.ndarray, q: float, *, tau: float | None = None) -> Bounds:
    """95% interval for the q-quantile of a series in arrival order."""
    arr = np.asarray(values, dtype=float)
    n = arr.size
    if n == 0:
        return None, None
    n_eff = effective_size(n, quantile_tau(arr, q) if tau is None else tau)
    lo_rank, hi_rank = order_statistic_ranks(n_eff, q)
    ordered = np.sort(arr)
    lo = None if lo_rank is None else float(ordered[max(1, math.floor(lo_rank * n / n_eff)) - 1])
    hi = None if hi_rank is None else float(ordered[min(n, math.ceil(hi_rank * n / n_eff)) - 1])
    # On a few correlated requests the ranks, scaled back from the effective size, can land past
    # the interpolated estimate (a p99 of 13 requests: the lower rank is the largest value). An
    # interval always holds its own estimate: widen it to it (conservative).
    estimate = float(np.quantile(arr, q))
    return (None if lo is None else min(lo, estimate)), (None if hi is None else max(hi, estimate))


def quantile_versus_bound(values: Sequence[float] | np.ndarray, q: float, bound: float) -> int:
    """+1 when the q-quantile is shown at or below `bound`, -1 when shown above it, 0 when neither.

    The same order-statistic test as `quantile_interval` (X_(r) <= bound exactly when at least r
    values are), with tau read on the series that test counts, 1[x <= bound]. Far from the bound
    that series barely varies and the verdict comes at once; near it, it is the quantile's own
    indicator. A sample of nearly equal values with a slow drift (its median indicator then looks
    strongly correlated) is judged on what matters: where it lies against the bound.
    """
    arr = np.asarray(values, dtype=float)
    n = arr.size
    if n == 0:
        return -1
    hits = arr <= bound
    n_eff = effective_size(n, autocorrelation_time(hits.astype(float)))
    lo_rank, hi_rank = order_statistic_ranks(n_eff, q)
    count = int(hits.sum())
    if hi_rank is not None and count >= min(n, math.ceil(hi_rank * n / n_eff)):
        return 1
    if lo_rank is not None and count < max(1, math.floor(lo_rank * n / n_eff)):
        return -1
    return 0


def mean_interval(values: Sequence[float] | np.ndarray) -> Bounds:
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return None, None
    n_eff = effective_size(arr.size, autocorrelation_time(arr))
    half = Z_975 * float(arr.std(ddof=1)) / math.sqrt(n_eff)
    mean = float(arr.mean())
    return mean - half, mean + half


def proportion_interval(hits: Sequence[bool] | np.ndarray) -> Bounds:
    """Wilson score interval for the fraction of hits, on the effective sample size."""
    arr = np.asarray(hits, dtype=float)
    if arr.size == 0:
        return None, None
    n = effective_size(arr.size, autocorrelation_time(arr))
    p = float(arr.mean())
    z2 = Z_975**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_interval(
    end_times_s: Sequence[float], weights: Sequence[float], start_s: float, stop_s: float
) -> Bounds:
    """95% interval of sum(weights) per second over [start_s, stop_s), by batch means."""
    duration = stop_s - start_s
    if duration <= 0 or len(end_times_s) < RATE_BATCHES:
        return None, None
    edges = np.linspace(start_s, stop_s, RATE_BATCHES + 1)
    per_batch, _ = np.histogram(np.asarray(end_times_s, dtype=float), bins=edges, weights=np.asarray(weights, dtype=float))
    rates = per_batch / (duration / RATE_BATCHES)
    half = T_975_9 * float(rates.std(ddof=1)) / math.sqrt(RATE_BATCHES)
    mean = float(rates.mean())
    return max(0.0, mean - half), mean + half


def latency_intervals(values: Sequence[float] | np.ndarray) -> dict[str, list[float | None]] | None:
    """The `ci95` of a latency summary: mean and each percentile; None for an empty sample."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return None
    out: dict[str, list[float | None]] = {"mean": list(mean_interval(arr))}
    for name, q in QUANTILES.items():
        out[name] = list(quantile_interval(arr, q))
    return out
