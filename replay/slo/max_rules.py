"""Rules over a maximum, judged the same at any window length.

`max_preemptions` and `kv_cache_usage_max` bounded the worst moment of a window. A longer window
is more likely to meet that moment, so one load passed on a long step and failed on a short one
(or the other way round). Here each is judged on a figure whose meaning does not depend on the
window's length:

- **max_preemptions = 0** keeps its strict meaning over a stated minimum observation, the same for
  every step: no preemption while the window's first `EXPOSURE_REQUESTS` measured requests ran
  (from the window's open to the end of the last of them, in arrival order; vLLM's counter is
  read at the first scrape after that end, so the span is up to one scrape interval longer).
  Preemptions after that exposure are counted in the rate, not in this rule. A window that ran
  out of time (or budget) before that many requests (or before its own lower `min_requests`) and
  saw none is inconclusive, not a pass: it did not observe the minimum.
- **max_preemptions = N > 0** is a rate: at most N preemptions per `EXPOSURE_REQUESTS` requests.
  The window's preemptions per measured request get an exact Poisson 95% interval (Garwood); the
  rule passes when the whole interval is at or below N / EXPOSURE_REQUESTS, fails when it is
  wholly above, and is inconclusive otherwise (so a rate bound needs enough requests: with no
  preemption at all, 3.7 / rate of them).
- **kv_cache_usage_max = b** bounds the share of the window's time above b: the share of vLLM's
  KV-cache usage samples inside the window above b must be at most `KV_ABOVE_SHARE_LIMIT`.
  Samples come at the scrape interval, so the share is a time share. A brief peak above b no
  longer fails a window; a cache that sits full does, at any length. The share is judged on at
  least `KV_MIN_SAMPLES` samples: on fewer, one sample above b is already a share over the
  limit, and a window of 12 samples would fail on one brief peak, as the old peak rule did.
  Such a window measures on (replay.step.window) and, if it still has too few, is inconclusive.
  A window may close as a failure before its minimum only once its share would stay over the
  limit even on the samples the whole minimum window would hold (replay.step.window's
  projection), so that a step is not failed on its first seconds by a share that the same
  samples, met later in a full window, would pass.

A result without these figures (an older file, a server without metrics) is judged as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from replay.records import RequestRecord
from replay.results import StepResult, Verdict
from replay.server.metrics import Sample

# The stated minimum observation of `max_preemptions`: the floor on a window's measured requests.
EXPOSURE_REQUESTS = 100
# A window may spend at most this share of its time with the KV cache above kv_cache_usage_max.
KV_ABOVE_SHARE_LIMIT = 0.05
# The fewest samples a KV share is judged on: one sample above the bound in this many is the limit.
KV_MIN_SAMPLES = round(1 / KV_ABOVE_SHARE_LIMIT)
# How a window closes before its count: on its time limit, or on the point's time budget.
SHORT_CLOSES = ("time", "budget")
_ALPHA_SIDE = 0.025


def _poisson_cdf(k: int, lam: float) -> float:
    """P(X <= k), X ~ Poisson(lam)."""
    if lam <= 0:
        return 1.0
    term = math.exp(-lam)
    total = term
    for i in range(1, k + 1):
        term *= lam / i
        total += term
    return min(1.0, total)


def poisson_interval(count: int) -> tuple[float, float]:
    """Exact (Garwood) 95% interval of a Poisson mean from one count, by bisection."""

    def solve(target: float, k: int) -> float:
        lo, hi = 0.0, max(10.0, 4.0 * (k + 1))
        for _ in range(100):
            mid = (lo + hi) / 2
            if _poisson_cdf(k, mid) > target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if count == 0 else solve(1 - _ALPHA_SIDE, count - 1)
    return lower, solve(_ALPHA_SIDE, count)


def preemptions_within(
    samples: Sequence[Sample], open_s: float, measured: Sequence[RequestRecord], exposure: int = EXPOSURE_REQUESTS
) -> float | None:
    """Preemptions from the window's open until the first `exposure` measured requests (arrival
    order) had ended; None without the counter."""
    counted = [s for s in samples if s.preemptions is not None]
    before = [s for s in counted if s.t_s <= open_s]
    if not before or not measured:
        return None
    first = sorted(measured, key=lambda r: r.send_s)[:exposure]
    until = max(r.end_s for r in first)
    after = [s for s in counted if s.t_s >= until]
    last = after[0] if after else counted[-1]
    seen = max(0.0, float(last.preemptions) - float(before[-1].preemptions))
    # Without a read after the exposure ended, what was seen is a lower bound: a preemption seen
    # settles the rule, none seen does not.
    return seen if after or seen > 0 else None


def partial_verdict(step: StepResult, bound: float) -> Verdict | None:
    """`max_preemptions` judged on a lower bound of the window's count (ServerSummary's
    preemptions_at_least, when the counter was not read at both edges): fail when even the bound
    breaks the rule, else inconclusive; None without a bound."""
    seen = step.server.preemptions_at_least
    if seen is None:
        return None
    if bound == 0:
        return "fail" if seen > 0 else "inconclusive"
    n = step.requests_ok + step.requests_failed
    if n and poisson_interval(int(round(seen)))[0] / n > bound / EXPOSURE_REQUESTS:
        return "fail"
    return "inconclusive"


def kv_usage_inside(samples: Sequence[Sample], open_s: float, close_s: float | None = None) -> list[float]:
    """The KV-cache usage samples inside the window (after its open, up to its close)."""
    return [
        s.kv_cache_usage for s in samples
        if open_s < s.t_s and (close_s is None or s.t_s <= close_s) and s.kv_cache_usage is not None
    ]


def kv_share_above(samples: Sequence[Sample], open_s: float, close_s: float, bound: float) -> float | None:
    """The share of KV-cache usage samples inside the window above `bound`; None without any."""
    return _share_above(kv_usage_inside(samples, open_s, close_s), bound)


def _share_above(usage: Sequence[float], bound: float) -> float | None:
    return sum(1 for u in usage if u > bound) / len(usage) if usage else None


def saw_no_work(samples: Sequence[Sample]) -> bool:
    """True when there are samples and every one read 0 requests running: with requests finishing
    meanwhile, they caught the engine only between its work (replay.step.result)."""
    return bool(samples) and all(s.running == 0 for s in samples)


def kv_share_verdict(above: int, n: int, floor: int = KV_MIN_SAMPLES) -> Verdict | None:
    """The KV rule on `above` of `n` samples over its bound: pass at a share within the limit, fail
    when even `floor` samples (at least `KV_MIN_SAMPLES`) would leave it over the limit, else
    inconclusive (too few samples to tell a brief peak from a full cache); None without samples."""
    if n == 0:
        return None
    if above / n <= KV_ABOVE_SHARE_LIMIT:
        return "pass"
    return "fail" if above / max(n, floor, KV_MIN_SAMPLES) > KV_ABOVE_SHARE_LIMIT else "inconclusive"


def kv_verdict_on(usage: Sequence[float], bound: float, floor: int = KV_MIN_SAMPLES) -> Verdict | None:
    """The KV rule on a window's usage samples (so far, while it runs; `floor`: see kv_share_verdict)."""
    return kv_share_verdict(sum(1 for u in usage if u > bound), len(usage), floor)


def kv_samples_above(step: StepResult) -> int | None:
    """How many of the step's KV samples read above the bound (None: the count was not kept)."""
    if step.kv_cache_above_share is None or not step.kv_cache_samples:
        return None
    return round(step.kv_cache_above_share * step.kv_cache_samples)


def figures(
    samples: Sequence[Sample],
    open_s: float | None,
    close_s: float | None,
    measured: Sequence[RequestRecord],
    step: StepResult,
    slo: dict[str, float],
) -> dict[str, object]:
    """The StepResult fields these rules are judged on (empty when the SLOs set neither rule)."""
    out: dict[str, object] = {}
    if open_s is None or close_s is None:
        return out
    if "max_preemptions" in slo and step.server.preemptions is not None:
        n = step.requests_ok + step.requests_failed
        out["preemptions_in_exposure"] = preemptions_within(samples, open_s, measured)
        if n:
            lo, hi = poisson_interval(int(round(step.server.preemptions)))
            out["preemptions_per_request"] = step.server.preemptions / n
            out["preemptions_per_request_ci95"] = [lo / n, hi / n]
    if "kv_cache_usage_max" in slo:
        usage = kv_usage_inside(samples, open_s, close_s)
        out["kv_cache_above_share"] = _share_above(usage, slo["kv_cache_usage_max"])
        out["kv_cache_samples"] = len(usage)
    return out


def short_of_exposure(step: StepResult, min_requests: int | None = None) -> bool:
    """Whether the window ran out of time (or the point's budget) before it measured the stated
    minimum observation: `EXPOSURE_REQUESTS` requests, or the window's own lower `min_requests`
    (a window that closed on that count observed what it was given; None: not known)."""
    floor = EXPOSURE_REQUESTS if min_requests is None else min(EXPOSURE_REQUESTS, min_requests)
    return step.window_closed_by in SHORT_CLOSES and step.requests_ok + step.requests_failed < floor


def verdict(step: StepResult, key: str, bound: float, min_requests: int | None = None) -> Verdict | None:
    """The rule's verdict on the length-independent figure; None when the step lacks it (judged
    as before, on the window's count or peak). `min_requests` is the window's minimum."""
    if key == "max_preemptions":
        if bound == 0:
            if step.preemptions_in_exposure is None:
                return None
            if step.preemptions_in_exposure > 0:
                return "fail"
            # None seen over fewer requests than the stated minimum observation, in a window that
            # ran out of time before it: not a pass.
            return "inconclusive" if short_of_exposure(step, min_requests) else "pass"
        ci = step.preemptions_per_request_ci95
        if ci is None:
            return None
        limit = bound / EXPOSURE_REQUESTS
        if ci[1] <= limit:
            return "pass"
        return "fail" if ci[0] > limit else "inconclusive"
    if key == "kv_cache_usage_max":
        share, above = step.kv_cache_above_share, kv_samples_above(step)
        if share is None:
            return None
        if above is None:
            # A result written before the sample count was kept: judged on the share alone.
            judged: Verdict | None = "pass" if share <= KV_ABOVE_SHARE_LIMIT else "fail"
        else:
            judged = kv_share_verdict(above, step.kv_cache_samples)
        if judged == "pass" and step.server.samples_saw_no_work:
            # Every sample read 0 running while requests finished: a share within the limit from
            # samples that saw no work reads nothing as 0. Undecided (the window measured on for a
            # sample that caught the engine at work: replay.step.window.gauges_undecided); samples
            # above the bound are readings of the cache all the same, and fail it.
            return "inconclusive"
        return judged
    return None
