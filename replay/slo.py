"""SLO expressions and their evaluation against a step.

`ttft_p99_ms=800,itl_p99_ms=60,e2e_p99_ms=20000,error_rate=0,max_preemptions=0,kv_cache_usage_max=0.95`

Latency keys are `<metric>_<stat>_ms` with metric in ttft, itl, tpot, e2e and stat in mean, p50,
p90, p95, p99, max; each is an upper bound. `error_rate` bounds failed / (ok + failed);
`max_preemptions` bounds the server's preemptions during the step; `kv_cache_usage_max` bounds
the peak KV-cache usage (a 0-1 fraction); `max_waiting` bounds the peak of waiting requests.

`server_<metric>_<stat>_ms` (metric in ttft, itl, tpot, e2e, queue; stat in mean, p50, p90, p95,
p99) bounds the same figure from vLLM's own histograms over the window instead of the client's
records; a server without them leaves the rule unverified. A step's `slo_views` names the view
(client or server) each rule was judged on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from replay.errors import SloSpecError
from replay.results import StepResult

LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e")
LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max")
SERVER_KEYS = ("max_preemptions", "kv_cache_usage_max", "max_waiting")
OTHER_KEYS = ("error_rate",) + SERVER_KEYS
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
    "kv_cache_usage_max, max_waiting"
)


def view(key: str) -> str:
    """The view a rule is judged on: "server" (vLLM's histograms, its gauges) or "client"."""
    return "server" if _SERVER_LATENCY_KEY.match(key) or key in SERVER_KEYS else "client"


def check_key(key: str) -> None:
    if re.match(r"^server_(ttft|itl|tpot|e2e|queue)_max_ms$", key):
        raise SloSpecError(f"SLO {key!r}: vLLM's histograms keep no maximum; bound server_..._p99_ms instead")
    if not (_LATENCY_KEY.match(key) or _SERVER_LATENCY_KEY.match(key) or key in OTHER_KEYS):
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
        if key in ("error_rate", "kv_cache_usage_max") and number > 1:
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
        if server_value is None:
            unverified.append(key)
        elif server_value > bound:
            violations.append(key)
    return violations, unverified
