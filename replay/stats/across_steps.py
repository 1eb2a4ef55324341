"""Intervals that hold across steps: the variance one step's own interval leaves out.

replay.stats.intervals shrinks a step's n requests to n / tau, with tau read from the step's own series
(Geyer's initial positive sequence). Measured again at the same load, steps differ by more than
that interval says, for two reasons this module corrects (the method is named *floored tau with
a between-step margin* in the docs, docs/concepts/repeatability.md):

1. **tau is underestimated on short windows.** On 50-100 strongly correlated requests the
   autocorrelation sum is cut early (lags up to n / 4, stopped at the first non-positive one), so
   tau comes out low and the interval too narrow. The tau a percentile rule is judged with is the
   largest of three estimates: Geyer's on the rule's indicator series; batch means over
   `BATCHES` consecutive sub-windows of the step (tau = batch size x variance of the batch means
   / variance of the series), which sees correlation that the truncated sum misses, taken only
   where it exceeds what independent requests give in 95% of windows; and the tau
   pooled over the point's earlier steps for the same rule within `NEAR` (20%) of the load
   (weighted by their requests), since the correlation is the server's and the corpus's at that
   load, not one window's. Each series pools its own kind: the figure's interval floors the tau
   of the quantile's indicator with the earlier steps' taus of theirs, and the verdict's count
   test floors the tau of 1[x <= bound] with theirs of 1[x <= bound]. Values close together that
   drift slowly make the first long (the indicator flips with the drift) while the second stays
   1 wherever the drift never reaches the bound: a step at 5% under the bound is not held
   undecided by the tau of its neighbours' quantile.
2. **A step cannot see what it shares.** A factor common to every request of a step (the
   server's state when the step began, what the previous step left in its caches, which prompts
   the step drew) moves the whole window's figures together; no within-step estimate shows it.
   The point's steps do: repeated or out-of-order steps scatter around the monotone fit of the
   figure's log against load. The between-step standard deviation of the log figure is that
   scatter's variance less the steps' own (from their within-step intervals), each step weighed
   by its precision (a random-effects meta-analysis' moment estimator: a 10-request step that read
   low among 400-request ones is mostly its own noise), pooled over the point's steps within
   `NEAR` (20%) of the load being judged, since steps near saturation scatter more than steps
   below it. Each interval is widened by z x that on the log scale (a
   multiplicative margin), and a percentile passes only when it clears `bound x exp(-z x sd)` on
   the order-statistic test, and fails only when it breaks `bound x exp(+z x sd)`. Until the point
   has a repeated or out-of-order step near the load there is no scatter to read and the margin
   is zero; it is at most `MAX_LOG_SD` (a factor of 1.63), past which the steps near the bound are coin tosses that
   the pass-probability fit (replay.search.pass_fit) reports.

Both apply to the figure's interval (`StepResult.slo_ci95`) and to the exceedance count behind
the verdict (how many requests met the bound, tested against the binomial order-statistic
ranks): a percentile verdict is conclusive only on the widened interval.

3. **A step left undecided is judged with its neighbours** (`pooled_check`). With strongly
   correlated requests the floored tau leaves a 100-400 request step few effective requests, and
   a p90 reading 20-25 ms against 30 stays inconclusive at any length. The figure is monotone in
   load, so every step at or above the load bounds it from above and every step at or below bounds
   it from below. A step whose own rule is undecided passes it when the precision-weighted mean
   of the log figure over the steps from its load up to `NEAR` above (itself included), each
   weighted by 1 / (its within-step variance + the between-step variance), is below the bound's
   log by z standard errors; it fails it when the mean over the steps from `NEAR` below up to its
   load is above by as much. The weighted mean of figures that are each at least the one at the
   load is itself at least it, so the pooled test errs only the way a single step's does. Every
   step near the load counts: one whose interval is open (often a short step that read high) is
   given the variance its requests imply, never left out. Where
   the point's steps near the load do not yet show their scatter, the between-step sd is taken at
   its largest (`MAX_LOG_SD`), so two or three steps alone rarely decide. On a point measured on
   several server starts only the judged step's own start's steps are pooled (`spread_of`'s
   `start`): the starts are there to show whether the engine's speed holds between them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from replay.results import StepResult
from replay.stats import intervals
from replay.stats.isotonic import isotonic

# Consecutive sub-windows for the batch-means tau: ten, as replay.stats.intervals' rate intervals use.
BATCHES = 10
# Fewer requests than this per batch say nothing about correlation: no batch-means estimate.
MIN_BATCH = 3
# On independent requests the batch-means ratio is chi-square with 9 degrees of freedom over 9:
# above its 95% point (16.919 / 9) it shows correlation; below it, it is read as noise, so
# independent windows are not made dearer in 19 of 20 cases.
BATCH_SIGNIFICANT = 16.918977604620448 / 9
# The largest between-step sd of a figure's log the margin takes (a factor of exp(1.96 x 0.25) =
# 1.63 each side). One pair of steps that read 4 and 40 ms at one load (a server that changed
# between them) would otherwise make every later verdict inconclusive at any load; past this
# spread a point's steps are coin tosses near the bound, and the pass-probability fit
# (replay.search.pass_fit), not the margin, says so.
MAX_LOG_SD = 0.25
# The steps whose scatter a verdict at load L takes its between-step sd from: loads within this
# share of L (spread_of).
NEAR = 0.2
# The fewest steps (the judged one included) pooled_check decides on: one alone is its own verdict.
MIN_POOLED = 2
_PERCENTILE_KEY = re.compile(r"^(ttft|itl|tpot|e2e)_(p50|p90|p95|p99)_ms$")


@dataclass(frozen=True)
class Spread:
    """What a point's earlier steps say about the variance one step cannot see, per SLO rule."""

    # Rule -> tau pooled over the earlier steps (a floor for this step's own): of the quantile's
    # indicator series (the figure's interval) ...
    tau: Mapping[str, float] = field(default_factory=dict)
    # ... and of the series the verdict counts, 1[x <= bound] (the count test).
    bound_tau: Mapping[str, float] = field(default_factory=dict)
    # Rule -> between-step standard deviation of the figure's natural log.
    log_sd: Mapping[str, float] = field(default_factory=dict)
    # Rule -> every earlier step's figure (pooled_check judges an undecided step with them).
    figures: Mapping[str, tuple[Figure, ...]] = field(default_factory=dict)
    # Rule -> the between-step sd pooled_check adds to each step's own variance: the measured one
    # near the load, `MAX_LOG_SD` where those steps do not show their scatter yet.
    pool_sd: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Figure:
    """A step's percentile figure as the pooled verdict reads it."""

    load: float
    log_value: float
    # The within-step variance of log_value, from the step's own 95% interval; None where that is
    # open on a side (pooled_check then gives it the variance its requests imply).
    variance: float | None
    requests: int | None = None


@dataclass(frozen=True)
class Pooled:
    """A percentile rule decided on the steps around its load (pooled_check): +1 passed on the
    steps from the load up, -1 failed on those from below up to it; the loads pooled, the pooled
    figure and its 95% interval (in the figure's unit)."""

    sign: int
    loads: tuple[float, ...]
    estimate: float
    ci95: tuple[float, float]


@dataclass(frozen=True)
class Check:
    """A percentile rule judged across steps: +1 shown within the bound, -1 shown above, 0 not
    shown either way; the widened 95% interval; the tau and margin it was judged with, and the
    step's own taus (Geyer's or batch means', the larger, never floored by earlier ones, so the pool
    cannot ratchet): on the quantile's indicator series, and on the series the verdict counts,
    1[x <= bound], which the point's later steps pool apart."""

    sign: int
    ci95: tuple[float | None, float | None]
    tau: float
    log_sd: float
    own_tau: float = 1.0
    bound_tau: float = 1.0


def percentile_rule(key: str) -> tuple[str, float] | None:
    """(metric, quantile) of a client percentile rule such as `tpot_p90_ms`, else None."""
    match = _PERCENTILE_KEY.match(key)
    return None if match is None else (match.group(1), intervals.QUANTILES[match.group(2)])


def batch_tau(series: Sequence[float] | np.ndarray, batches: int = BATCHES) -> float:
    """tau from the variance of `batches` consecutive batch means (>= 1; 1 on too few values)."""
    arr = np.asarray(series, dtype=float)
    size = arr.size // batches
    if size < MIN_BATCH:
        return 1.0
    var = float(arr[: size * batches].var())
    if var <= 0:
        return 1.0
    means = arr[: size * batches].reshape(batches, size).mean(axis=1)
    return max(1.0, size * float(means.var(ddof=1)) / var)


def step_tau(indicator: Sequence[float] | np.ndarray, floor: float = 1.0) -> float:
    """The largest of Geyer's tau, the batch-means tau (where it shows correlation beyond
    chance, `BATCH_SIGNIFICANT`) and `floor` (the point's pooled tau)."""
    arr = np.asarray(indicator, dtype=float)
    batches = batch_tau(arr)
    return max(intervals.autocorrelation_time(arr), batches if batches > BATCH_SIGNIFICANT else 1.0, floor, 1.0)


def _count_sign(arr: np.ndarray, q: float, bound: float, tau_floor: float) -> tuple[int, float]:
    """replay.stats.intervals.quantile_versus_bound's test with the floored tau: +1 when at least the
    upper rank's count of values is at or below `bound`, -1 when fewer than the lower rank's."""
    n = arr.size
    hits = arr <= bound
    tau = step_tau(hits.astype(float), tau_floor)
    n_eff = intervals.effective_size(n, tau)
    lo_rank, hi_rank = intervals.order_statistic_ranks(n_eff, q)
    count = int(hits.sum())
    if hi_rank is not None and count >= min(n, math.ceil(hi_rank * n / n_eff)):
        return 1, tau
    if lo_rank is not None and count < max(1, math.floor(lo_rank * n / n_eff)):
        return -1, tau
    return 0, tau


def quantile_check(
    values: Sequence[float] | np.ndarray,
    q: float,
    bound: float,
    *,
    tau_floor: float = 1.0,
    log_sd: float = 0.0,
    bound_tau_floor: float | None = None,
) -> Check:
    """The q-quantile of a step's series (arrival order) against an upper `bound`, across steps.

    `tau_floor` floors the tau of the figure's interval (the quantile's indicator series);
    `bound_tau_floor` (`tau_floor` when not given) that of the count test (1[x <= bound]). They
    differ where the values lie close together and drift slowly: the quantile's indicator then
    flips with the drift and reads a long tau, while whether a request met a bound the drift never
    came near does not vary at all (replay.stats.intervals.quantile_versus_bound)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return Check(-1, (None, None), 1.0, log_sd)
    count_floor = tau_floor if bound_tau_floor is None else bound_tau_floor
    margin = math.exp(intervals.Z_975 * log_sd)
    passes, tau_pass = _count_sign(arr, q, bound / margin, count_floor)
    fails, tau_fail = _count_sign(arr, q, bound * margin, count_floor)
    sign = 1 if passes == 1 else (-1 if fails == -1 else 0)
    own_tau = step_tau((arr <= np.quantile(arr, q)).astype(float))
    estimate_tau = max(own_tau, tau_floor)
    lo, hi = intervals.quantile_interval(arr, q, tau=estimate_tau)
    ci = (None if lo is None else lo / margin, None if hi is None else hi * margin)
    bound_tau = step_tau((arr <= bound).astype(float))
    return Check(sign, ci, max(tau_pass, tau_fail, estimate_tau), log_sd, own_tau, bound_tau)


def checks(
    slo: Mapping[str, float], samples: Mapping[str, Sequence[float]], spread: Spread | None = None
) -> dict[str, Check]:
    """Every client percentile rule of `slo` judged on `samples` (metric -> values)."""
    spread = spread or Spread()
    out: dict[str, Check] = {}
    for key, bound in slo.items():
        rule = percentile_rule(key)
        if rule is None or rule[0] not in samples:
            continue
        tau = spread.tau.get(key, 1.0)
        out[key] = quantile_check(
            samples[rule[0]], rule[1], bound,
            tau_floor=tau, log_sd=spread.log_sd.get(key, 0.0), bound_tau_floor=spread.bound_tau.get(key, tau),
        )
    return out


def informative(steps: Sequence[StepResult]) -> list[StepResult]:
    """The closed-loop steps that carry information, in order: an unresolved step measured too
    little, and a disturbed one (replay.step.environment) measured something else too."""
    return [s for s in steps if s.load.mode == "concurrency" and s.slo_verdict != "unresolved" and not s.disturbed]


def spread_of(
    steps: Sequence[StepResult], slo: Mapping[str, float], load: float | None = None, *, start: int | None = None
) -> Spread:
    """The pooled tau and the between-step log sd of each percentile rule over a point's
    closed-loop steps (see the module docstring). With `load` (the step about to be judged), both
    come from the steps within `NEAR` of it only: how strongly requests correlate and how much
    steps scatter depend on the load (near saturation a full KV cache, preemptions and the queue
    make each step's figures depend on where the server stood), and what steps at 56 in flight
    showed says nothing of steps at 30.

    With `start` (the server start the judged step runs on, [sweep] server_starts), the figures
    `pooled_check` decides with are that start's steps only: a later start is measured to show
    whether the engine holds at another level, and a slower start's undecided step pooled with a
    faster start's steps would pass on the other start's speed. The taus and the scatter keep
    every start's steps: they only widen the intervals."""
    closed = informative(steps)
    own = closed if start is None else [s for s in closed if s.server_start == start]
    near = closed if load is None else [s for s in closed if abs(s.load.value - load) <= NEAR * load]
    taus: dict[str, float] = {}
    bound_taus: dict[str, float] = {}
    sds: dict[str, float] = {}
    figures: dict[str, tuple[Figure, ...]] = {}
    pool_sd: dict[str, float] = {}
    for key in slo:
        rule = percentile_rule(key)
        if rule is None:
            continue
        # Both taus pooled over the same steps, weighted by their requests.
        measuring = [s for s in near if key in s.slo_tau and s.requests_ok]
        if measuring:
            total = sum(s.requests_ok for s in measuring)
            taus[key] = sum(s.requests_ok * s.slo_tau[key] for s in measuring) / total
            # A file written before slo_tau_bound: its quantile's tau stands in (the larger, as before).
            bound_taus[key] = sum(s.requests_ok * s.slo_tau_bound.get(key, s.slo_tau[key]) for s in measuring) / total
        measured, shown = _scatter(_log_points(near, key))
        sd = min(measured, MAX_LOG_SD)
        if sd > 0:
            sds[key] = sd
        figures[key] = tuple(f for s in own if (f := figure_of(s, key)) is not None)
        pool_sd[key] = sd if shown else MAX_LOG_SD
    return Spread(tau=taus, bound_tau=bound_taus, log_sd=sds, figures=figures, pool_sd=pool_sd)


def figure_of(step: StepResult, key: str) -> Figure | None:
    """The step's log figure for percentile rule `key` and its within-step variance (None where its
    interval is open on a side: too few requests for the rank); None where it measured none."""
    if percentile_rule(key) is None:
        return None
    metric, stat = key.split("_")[0], key.split("_")[1]
    summary = getattr(step, f"{metric}_ms")
    value = getattr(summary, stat)
    if value is None or value <= 0:
        return None
    ci = (summary.ci95 or {}).get(stat)
    within = None
    if ci is not None and ci[0] is not None and ci[1] is not None and ci[0] > 0:
        within = ((math.log(ci[1]) - math.log(ci[0])) / (2 * intervals.Z_975)) ** 2
    return Figure(step.load.value, math.log(value), within, step.requests_ok or None)


def _variances(figures: Sequence[Figure]) -> list[float] | None:
    """Each figure's within-step variance; one whose interval is open gets what its requests imply
    at the point's precision (the median of variance x requests over the others), as log_scatter
    does. A step that read far above its neighbours on few requests is often the one whose
    interval is open: leaving it out would pool only the steps that read low. None where a
    variance cannot be given."""
    known = [f.variance * f.requests for f in figures if f.variance is not None and f.variance > 0 and f.requests]
    per_request = float(np.median(known)) if known else None
    out = []
    for f in figures:
        if f.variance is not None:
            out.append(f.variance)
        elif per_request is not None and f.requests:
            out.append(per_request / f.requests)
        else:
            return None
    return out


def pooled_check(spread: Spread, key: str, bound: float, step: StepResult) -> Pooled | None:
    """A percentile rule the step left undecided, judged on the point's steps around its load
    (see the module docstring, 3.); None where those steps decide nothing either."""
    current = figure_of(step, key)
    if current is None or bound <= 0 or step.load.mode != "concurrency":
        return None
    load = current.load
    sd2 = spread.pool_sd.get(key, MAX_LOG_SD) ** 2
    everything = (*spread.figures.get(key, ()), current)
    for sign, pool in (
        (1, [f for f in everything if load <= f.load <= load * (1 + NEAR)]),
        (-1, [f for f in everything if load * (1 - NEAR) <= f.load <= load]),
    ):
        if len(pool) < MIN_POOLED:
            continue
        variances = _variances(pool)
        if variances is None or (sd2 == 0 and not all(v > 0 for v in variances)):
            continue
        weights = [1.0 / (v + sd2) for v in variances]
        total = sum(weights)
        mean = sum(w * f.log_value for w, f in zip(weights, pool)) / total
        half = intervals.Z_975 * math.sqrt(1.0 / total)
        if (sign == 1 and mean + half <= math.log(bound)) or (sign == -1 and mean - half > math.log(bound)):
            return Pooled(
                sign, tuple(sorted(f.load for f in pool)), math.exp(mean), (math.exp(mean - half), math.exp(mean + half))
            )
    return None


def between_step_log_sd(steps: Sequence[StepResult], key: str) -> float:
    """The scatter of the rule's log figure around its monotone (non-decreasing) fit against load,
    less the steps' own variance; 0 where no step scatters (every load measured once, in order)."""
    return log_scatter(_log_points(steps, key))


def _log_points(steps: Sequence[StepResult], key: str) -> list[tuple[float, float, float | None, int | None]]:
    """(load, log figure, within variance or None, requests or None) per step that measured it."""
    return [(f.load, f.log_value, f.variance, f.requests) for s in steps if (f := figure_of(s, key)) is not None]


def log_scatter(points: Sequence[tuple[float, float, float | None, int | None]]) -> float:
    """From (load, log figure, within-step variance or None, requests or None) per step: the
    between-step standard deviation, by the method of moments on the residuals around the monotone
    fit, each step weighted by its precision (1 / its within-step variance), as a random-effects
    meta-analysis weighs its studies: E[Q] = dof + tau2 x sum over the fit's blocks of
    (S1 - S2 / S1), DerSimonian and Laird's estimator, where Q is the weighted residual sum of
    squares, dof the steps less the fitted levels, and S1 and S2 a block's sum of weights and of
    their squares. Without weights the
    same estimator is the residual variance less the mean within-step variance.

    A step whose interval is open on a side (too few requests for the rank) has no within variance
    of its own; it is given the variance its request count implies at the point's precision (the
    median of within x requests over the steps that have both), so a 10-request step that read low
    weighs as little as its ten requests say, not as much as a 400-request one. Without any step
    to take that from, every step weighs the same and an unknown within variance counts as 0."""
    return _scatter(points)[0]


def _scatter(points: Sequence[tuple[float, float, float | None, int | None]]) -> tuple[float, bool]:
    """log_scatter's sd, and whether the steps show their scatter at all (a step repeated or out
    of order: more steps than fitted levels); without that the sd of 0 means unknown, not none."""
    if not points:
        return 0.0, False
    known = [w * n for _, _, w, n in points if w is not None and w > 0 and n]
    per_request = float(np.median(known)) if known else None
    variances: list[float | None] = []
    for _, _, within, n in points:
        if within is not None and within > 0:
            variances.append(within)
        elif per_request is not None and n:
            variances.append(per_request / n)
        else:
            variances.append(None)
    weighted = all(v is not None for v in variances)
    weights = [1.0 / v for v in variances] if weighted else [1.0] * len(points)  # type: ignore[operator]
    loads = sorted({x for x, _, _, _ in points})
    total = {x: sum(w for (x2, _, _, _), w in zip(points, weights) if x2 == x) for x in loads}
    means = [sum(y * w for (x2, y, _, _), w in zip(points, weights) if x2 == x) / total[x] for x in loads]
    fitted = dict(zip(loads, isotonic(means, [total[x] for x in loads])))
    blocks = len(set(fitted.values()))
    dof = len(points) - blocks
    if dof < 1:
        return 0.0, False
    if weighted:
        q = sum(w * (y - fitted[x]) ** 2 for (x, y, _, _), w in zip(points, weights))
        # DerSimonian-Laird's denominator, summed over the fit's blocks (the steps whose loads share
        # a fitted level): E[Q] = dof + tau2 x sum(S1 - S2 / S1). dof x mean weight equals it only
        # for equal weights; beside a near-exact step it read the scatter 10^4 times too small.
        blocks_of: dict[float, list[float]] = {}
        for (x, _, _, _), w in zip(points, weights):
            blocks_of.setdefault(fitted[x], []).append(w)
        # S1 - S2 / S1 = 2 x sum over pairs of w_i x w_j / S1, summed pair by pair: the subtraction
        # cancels to 0 in floating point once one weight is 10^16 times another, the very case
        # this estimator must see. dof >= 1 leaves a block of two steps or more, so it is > 0.
        denominator = 0.0
        for block in blocks_of.values():
            before = pairs = 0.0
            for w in sorted(block):
                pairs += w * before
                before += w
            denominator += 2 * pairs / before
        return math.sqrt(max(0.0, (q - dof) / denominator)), True
    rss = sum((y - fitted[x]) ** 2 for x, y, _, _ in points)
    own = [v for v in variances if v is not None]
    return math.sqrt(max(0.0, rss / dof - (float(np.mean(own)) if own else 0.0))), True
