"""SLO expressions and their evaluation against a step.

`ttft_p99_ms=800,itl_p99_ms=60,e2e_p99_ms=20000,error_rate=0,max_preemptions=0,kv_cache_usage_max=0.95`

Latency keys are `<metric>_<stat>_ms` with metric in ttft, itl, tpot, e2e and stat in mean, p50,
p90, p95, p99, max; each is an upper bound. `error_rate` bounds failed / (ok + failed);
`max_preemptions` bounds the server's preemptions and `kv_cache_usage_max` its KV-cache usage (a
0-1 fraction), both judged the same at any window length (replay.slo.max_rules: 0 preemptions over
the window's first 100 measured requests, or a rate per 100 requests with an interval; the share
of the window's time above the usage bound); `max_waiting` bounds the peak of waiting requests.

`server_<metric>_<stat>_ms` (metric in ttft, itl, tpot, e2e, queue; stat in mean, p50, p90, p95,
p99) bounds the same figure from vLLM's own histograms over the window instead of the client's
records; a server without them leaves the rule unverified. A step's `slo_views` names the view
(client or server) each rule was judged on.

`min_slo_attainment` is a lower bound on the fraction of requests that met every per-request
bound (see `per_request_bounds`), as vLLM's `--goodput` and DistServe state an SLO.

Verdicts are three-valued: a latency percentile or mean passes when its whole 95% interval meets
the bound, fails when the whole interval breaks it, and is inconclusive otherwise; attainment
likewise on its interval. Maxima, error rates, the server's histogram figures (no per-request
sample to bound; their resolution is the bucket's) and its counts and peaks are judged as
measured.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from replay.errors import SloSpecError
from replay.results import StepResult, Verdict
from replay.slo import max_rules
from replay.stats import across_steps, intervals

LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e")
LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max")
SERVER_KEYS = ("max_preemptions", "kv_cache_usage_max", "max_waiting")
OTHER_KEYS = ("error_rate",) + SERVER_KEYS
ATTAINMENT_KEY = "min_slo_attainment"
# Metrics whose per-request value is bounded for SLO attainment and goodput (ITL is per gap).
PER_REQUEST_METRICS = ("ttft", "tpot", "e2e")
_LATENCY_KEY = re.compile(r"^(ttft|itl|tpot|e2e)_(mean|p50|p90|p95|p99|max)_ms$")
SERVER_LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e", "queue")
# A histogram keeps no maximum, so there is no server_*_max_ms.
SERVER_LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99")
_SERVER_LATENCY_KEY = re.compile(r"^server_(ttft|itl|tpot|e2e|queue)_(mean|p50|p90|p95|p99)_ms$")

DEFAULT_SLO: dict[str, float] = {
    "ttft_p99_ms": 800.0,
    "itl_p99_ms": 60.0,
    "e2e_p99_ms": 20000.0,
    "error_rate": 0.0,
    "max_preemptions": 0.0,
    "kv_cache_usage_max": 0.95,
}

VALID_KEYS_HELP = (
    "<ttft|itl|tpot|e2e>_<mean|p50|p90|p95|p99|max>_ms, "
    "server_<ttft|itl|tpot|e2e|queue>_<mean|p50|p90|p95|p99>_ms, error_rate, max_preemptions, "
    "kv_cache_usage_max, max_waiting, min_slo_attainment"
)
# A window never closes on fewer measured requests than this, whatever the SLOs.
MIN_REQUESTS_FLOOR = 100


def view(key: str) -> str:
    """The view a rule is judged on: "server" (vLLM's histograms, its gauges) or "client"."""
    return "server" if _SERVER_LATENCY_KEY.match(key) or key in SERVER_KEYS else "client"


def check_key(key: str) -> None:
    if re.match(r"^server_(ttft|itl|tpot|e2e|queue)_max_ms$", key):
        raise SloSpecError(f"SLO {key!r}: vLLM's histograms keep no maximum; bound server_..._p99_ms instead")
    if not (_LATENCY_KEY.match(key) or _SERVER_LATENCY_KEY.match(key) or key in OTHER_KEYS or key == ATTAINMENT_KEY):
        raise SloSpecError(f"unknown SLO {key!r}; valid SLOs are {VALID_KEYS_HELP}")


def validate(slo: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in slo.items():
        check_key(key)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise SloSpecError(f"SLO {key}: {value!r} is not a number") from None
        if number < 0:
            raise SloSpecError(f"SLO {key}: {value!r} is negative; bounds are >= 0")
        if key in ("error_rate", "kv_cache_usage_max", ATTAINMENT_KEY) and number > 1:
            raise SloSpecError(f"SLO {key}: {value!r} is a fraction and must be between 0 and 1")
        out[key] = number
    return out


def parse(spec: str) -> dict[str, float]:
    """Parse `key=value,key=value`. An empty string means no SLOs."""
    slo: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise SloSpecError(f"SLO {part!r} is not key=value (for example ttft_p99_ms=800)")
        slo[key.strip()] = value.strip()
    return validate(slo)


def evaluate(step: StepResult, slo: Mapping[str, float]) -> tuple[list[str], list[str]]:
    """Return (violated SLO names, SLO names that could not be checked) for a step."""
    violations: list[str] = []
    unverified: list[str] = []
    for key, bound in slo.items():
        match = _SERVER_LATENCY_KEY.match(key)
        if match:
            metric, stat = match.groups()
            histogram = getattr(step.server, f"{metric}_ms")
            value = getattr(histogram, stat) if histogram is not None else None
            if histogram is None:
                unverified.append(key)
            elif value is None or value > bound:
                # Like the client's keys: no request in the window means nothing met the target.
                violations.append(key)
            continue
        match = _LATENCY_KEY.match(key)
        if match:
            metric, stat = match.groups()
            value = getattr(getattr(step, f"{metric}_ms"), stat)
            # No completed request means nothing met the latency target.
            if value is None or value > bound:
                violations.append(key)
            continue
        if key == ATTAINMENT_KEY:
            if step.slo_attainment is None or step.slo_attainment < bound:
                violations.append(key)
            continue
        if key == "error_rate":
            total = step.requests_ok + step.requests_failed
            if total == 0 or step.requests_failed / total > bound:
                violations.append(key)
            continue
        server_value = {
            "max_preemptions": step.server.preemptions,
            "kv_cache_usage_max": step.server.kv_cache_usage_peak,
            "max_waiting": step.server.waiting_peak,
        }[key]
        judged = max_rules.verdict(step, key, bound)
        if judged is not None:
            # Judged the same at any window length (replay.slo.max_rules); where no sample caught
            # the engine at work (samples_saw_no_work) the KV share is undecided. Inconclusive is no
            # violation of what was measured, and `verdicts` keeps it inconclusive.
            if judged == "fail":
                violations.append(key)
        elif server_value is None:
            if key == "max_preemptions" and max_rules.partial_verdict(step, bound) == "fail":
                # The reads that were made already saw more preemptions than the bound allows.
                violations.append(key)
            else:
                unverified.append(key)
        elif server_value > bound:
            violations.append(key)
    return violations, unverified


def per_request_bounds(slo: Mapping[str, float]) -> dict[str, float]:
    """The bound each request's TTFT, TPOT and e2e latency must meet to count as attained: the
    loosest bound set on that metric (a p99 bound, say, rather than a p50 one)."""
    bounds: dict[str, float] = {}
    for key, bound in slo.items():
        match = _LATENCY_KEY.match(key)
        if match and match.group(1) in PER_REQUEST_METRICS:
            metric = match.group(1)
            bounds[metric] = max(bound, bounds.get(metric, bound))
    return bounds


def min_requests_for(slo: Mapping[str, float]) -> int:
    """Measured requests a window needs before its bounds can be finite: a p99 bound needs a
    finite upper bound on the p99 (368 independent requests), never fewer than 100."""
    needed = [MIN_REQUESTS_FLOOR]
    for key, bound in slo.items():
        match = _LATENCY_KEY.match(key)
        if match and match.group(2) in intervals.QUANTILES:
            needed.append(intervals.min_sample_for(intervals.QUANTILES[match.group(2)]))
        elif key == ATTAINMENT_KEY and 0 < bound < 1:
            needed.append(intervals.min_sample_for(bound))
    return max(needed)


def _interval_verdict(bounds: list[float | None] | None, point: float | None, bound: float, *, upper: bool) -> Verdict:
    """`upper`: the figure must stay at or below the bound (latencies); else at or above it."""
    if bounds is None:
        # A result written before intervals existed: judged as measured.
        if point is None:
            return "fail"
        return "pass" if (point <= bound if upper else point >= bound) else "fail"
    lo, hi = bounds
    if upper:
        if hi is not None and hi <= bound:
            return "pass"
        if lo is not None and lo > bound:
            return "fail"
    else:
        if lo is not None and lo >= bound:
            return "pass"
        if hi is not None and hi < bound:
            return "fail"
    return "inconclusive"


def verdicts(
    step: StepResult,
    slo: Mapping[str, float],
    samples: Mapping[str, Sequence[float]] | None = None,
    spread: across_steps.Spread | None = None,
    min_requests: int | None = None,
) -> tuple[dict[str, Verdict], list[str]]:
    """Per-SLO verdicts for a step, and the SLOs that could not be checked (left out of the first,
    except a server figure the window failed to sample, which is there as inconclusive).

    `samples` (metric -> values in arrival order, as the step measured them) lets a percentile be
    judged across steps by `across_steps.quantile_check` (its tau floored, its bound moved by the
    between-step margin that `spread`, read from the point's earlier steps, gives) and, where that
    leaves it undecided, by `across_steps.pooled_check` on the steps around its load; without them
    (a saved result) by its ci95. `min_requests` is the window's minimum (replay.slo.max_rules)."""
    violations, unverified = evaluate(step, slo)
    out: dict[str, Verdict] = {}
    for key, bound in slo.items():
        if key in unverified:
            # A server that exports the figure but was not sampled in this window: undecided,
            # never passed unseen (the search measures such a step again).
            if key in SERVER_KEYS and step.server.metrics_available and (
                not step.server.window_sampled or step.server.samples_saw_no_work
            ):
                out[key] = "inconclusive"
            elif key == "max_preemptions" and max_rules.partial_verdict(step, bound) is not None:
                # The counter was read over part of the window only.
                out[key] = "inconclusive"
            continue
        match = _LATENCY_KEY.match(key)
        if match and match.group(2) != "max":
            metric, stat = match.groups()
            summary = getattr(step, f"{metric}_ms")
            point = getattr(summary, stat)
            if point is None:
                out[key] = "fail"
            elif samples is not None and metric in samples and stat in intervals.QUANTILES:
                sign = across_steps.checks({key: bound}, samples, spread)[key].sign
                if sign == 0 and spread is not None:
                    # Undecided alone: judged with the point's steps around its load.
                    pooled = across_steps.pooled_check(spread, key, bound, step)
                    sign = 0 if pooled is None else pooled.sign
                out[key] = {1: "pass", -1: "fail", 0: "inconclusive"}[sign]
            else:
                ci = summary.ci95.get(stat) if summary.ci95 is not None else None
                out[key] = _interval_verdict(ci, point, bound, upper=True)
        elif key == ATTAINMENT_KEY and bound < 1 and step.slo_attainment is not None:
            out[key] = _interval_verdict(step.slo_attainment_ci95, step.slo_attainment, bound, upper=False)
        elif (judged := max_rules.verdict(step, key, bound, min_requests)) is not None:
            out[key] = judged
        else:
            out[key] = "fail" if key in violations else "pass"
    return out, unverified


def only_short_of_time(
    step: StepResult, slo: Mapping[str, float], rule_verdicts: Mapping[str, Verdict], max_requests: int | None
) -> bool:
    """Whether a window that closed on time, short of its largest sample, failed to pass only for
    want of requests: no rule failed on what was measured, and every undecided figure's estimate
    is inside its bound. Such a step is `unresolved`, not a failure."""
    measured = step.requests_ok + step.requests_failed + step.steady_state_dropped
    if max_requests is not None and measured >= max_requests:
        return False
    for key, verdict in rule_verdicts.items():
        if verdict == "pass":
            continue
        point = _point_estimate(step, key)
        if point is None:
            continue  # nothing measured for it: no evidence either way
        if verdict == "fail":
            return False
        if not (point >= slo[key] if key == ATTAINMENT_KEY else point <= slo[key]):
            return False
    return True


def _point_estimate(step: StepResult, key: str) -> float | None:
    """The figure a rule is judged on, None when the window measured nothing for it."""
    if match := _SERVER_LATENCY_KEY.match(key):
        metric, stat = match.groups()
        histogram = getattr(step.server, f"{metric}_ms")
        return None if histogram is None else getattr(histogram, stat)
    if match := _LATENCY_KEY.match(key):
        metric, stat = match.groups()
        return getattr(getattr(step, f"{metric}_ms"), stat)
    if key == ATTAINMENT_KEY:
        return step.slo_attainment
    if key == "error_rate":
        total = step.requests_ok + step.requests_failed
        return step.requests_failed / total if total else None
    return {
        "max_preemptions": step.server.preemptions,
        "kv_cache_usage_max": step.server.kv_cache_usage_peak,
        "max_waiting": step.server.waiting_peak,
    }[key]


def ratios(step: StepResult, slo: Mapping[str, float]) -> dict[str, float]:
    """measured / bound for every rule that bounds a figure from above with a positive bound (a
    latency, the KV-cache usage peak), and the shortfall ratio (1 - attained) / (1 - bound) for
    min_slo_attainment: above 1 where the rule broke. The search models these against load."""
    out: dict[str, float] = {}
    for key, bound in slo.items():
        if key in ("error_rate", "max_preemptions", "max_waiting"):
            continue  # counts, usually bounded at 0: no ratio to interpolate
        point = _point_estimate(step, key)
        if point is None:
            continue
        if key == ATTAINMENT_KEY:
            if bound < 1:
                out[key] = (1 - point) / (1 - bound)
        elif bound > 0:
            out[key] = point / bound
    return out


def step_verdict(rule_verdicts: Mapping[str, Verdict]) -> Verdict:
    values = set(rule_verdicts.values())
    if "fail" in values:
        return "fail"
    return "inconclusive" if "inconclusive" in values else "pass"
