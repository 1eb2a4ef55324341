"""When a step stops: the warm-up, the measurement window and its closing rules.

The window opens once the warm-up has completed (`warmup_requests` finished and `warmup_s`
passed). Under a closed loop's ramp-up (replay.load.drivers) only requests sent after the ramp
count toward the warm-up and its request duration: those sent during it ran at a part of the load,
and read short. Latency figures come from requests *sent* inside the window; throughput from every
request that *finished* inside it. The window closes once `min_requests` measured requests have
finished and `min_window_s` has passed, or at its time limit. Requests still running then are
drained: awaited, not counted, never failures.

The time limit is `max_window_s` when set; otherwise it is sized from the warm-up, which
measures the request duration D at this load: a closed loop of c finishes about c / D requests a
second, so `max_requests` measured requests take about D + max_requests x D / c, and the window
gets `SIZE_FACTOR` times that. A step never runs past `time_budget_s` (what is left of the
point's budget), whatever the sizing says.

With SLOs, a window that has its minimum but whose verdict is still inconclusive keeps measuring
(the cursor hands out fresh prompts) and is judged again each time it has grown by a quarter,
until the verdict is pass or fail, `max_requests` measured requests, or the time limit. Looking
at a growing sample a few times, geometrically spaced, keeps the extra chance of a wrong
verdict small; a step that ends inconclusive counts as a failure. A step that is already a
conclusive failure closes early: from `EARLY_FAIL_REQUESTS` measured requests on (a p99 whose
lower bound is above its limit), or, from `EARLY_SERVER_FAIL_REQUESTS` on, as soon as vLLM's
gauges break a server-side SLO (preemptions, KV-cache usage, waiting requests), so steps above
the knee are cheap.

A window that ran out of time (its limit or the budget) before it had the requests its bounds
need, with every undecided figure's estimate inside its bound, is `unresolved`: not enough time
is not a failure, and the search treats it as no information.

The result's figures come from replay.step.figures, which applies the steady-state rule
(replay.stats.steady) to the measured requests first.

"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from replay.load.kinds import Concurrency, Load, PoissonRate, TraceReplay
from replay.records import RequestRecord
from replay.results import ClientSummary, ServerSummary
from replay.server.metrics import MetricsScraper
from replay.slo import max_rules
from replay.slo import rules as slo_mod
from replay.stats.across_steps import Spread
from replay.step.figures import build_result, latency_samples

# An inconclusive window is judged again once it has this many times the requests it had.
RECHECK_GROWTH = 1.25
# A window may close as a failure from this many measured requests on, before its minimum: on
# its latency figures, and on vLLM's gauges.
EARLY_FAIL_REQUESTS = 40
EARLY_SERVER_FAIL_REQUESTS = 10
# A window sized from the warm-up gets this many times the expected wall time of max_requests.
SIZE_FACTOR = 2.0


@dataclass(frozen=True)
class Window:
    warmup_requests: int | None = None
    warmup_s: float = 0.0
    min_requests: int = 100
    # An inconclusive window measures on up to this many requests (None: stop at min_requests).
    max_requests: int | None = None
    min_window_s: float = 0.0
    # The window's time limit; None: sized from the warm-up's request duration (SIZE_FACTOR).
    max_window_s: float | None = 600.0
    # A warm-up that has not finished after this long means a stalled server (the step fails).
    warmup_timeout_s: float = 600.0
    # The most the whole step (warm-up included) may take: what is left of the point's budget.
    time_budget_s: float | None = None
    # Open loop: never more than this many requests in flight; past it, sends are late (and flagged).
    # Requests still running when the window closes are bounded by the client's request time-out.
    max_inflight: int = 4096
    # Session corpora: the mean think time before a turn (turn 1's none included). A user's cycle
    # per request is its duration plus this, so a window sized from the warm-up adds it.
    think_per_request_s: float = 0.0
    # What the point's earlier steps say about the variance a step cannot see (replay.stats.across_steps).
    spread: Spread | None = None
    # A closed loop's workers start evenly over this many seconds (replay.load.drivers); the
    # window opens no sooner.
    ramp_s: float = 0.0

    def warmup_for(self, load: Load) -> int:
        if self.warmup_requests is not None:
            return self.warmup_requests
        match load:
            case Concurrency(n=n):
                return n
            case PoissonRate(rate_per_s=rate):
                return max(1, math.ceil(rate * 2))
            case TraceReplay():
                return 0


def expected_window_s(load: Load, requests: int, duration_s: float) -> float | None:
    """Expected wall time for `requests` measured requests that each last `duration_s`."""
    match load:
        case Concurrency(n=n):
            return duration_s + requests * duration_s / n
        case PoissonRate(rate_per_s=rate):
            return duration_s + requests / rate
        case _:
            return None


@dataclass
class WindowState:
    """The mutable state of a running step's window: it opens after the warm-up, takes each
    finished request into account, and closes (when to stop) on its rules."""

    warmup: int
    settings: Window
    started_s: float
    on_close: Callable[[], None]
    load: Load = field(default_factory=lambda: Concurrency(1))
    on_open: Callable[[], None] = lambda: None
    # The verdict the measured sample so far gives ("pass", "fail", "inconclusive"); None: no SLO.
    judge: Callable[[list[RequestRecord], float], str] | None = None
    # True once vLLM's gauges broke a server-side SLO inside the window.
    server_broke: Callable[[float], bool] | None = None
    # True while vLLM's gauges leave a server-side SLO undecided for want of samples: the window
    # measures on (up to max_requests or its time limit).
    server_undecided: Callable[[], bool] | None = None
    next_check: int = 0
    next_early_check: int = EARLY_FAIL_REQUESTS
    # Requests of the warm-up that finished: before the window opened, sent after the ramp-up.
    warmed: int = 0
    open_s: float | None = None
    close_s: float | None = None
    # requests, verdict, time, budget, stall, trace_end or abort
    closed_by: str | None = None
    # Mean end-to-end duration of the warm-up's requests, and the window's time limit from it.
    request_duration_s: float | None = None
    limit_s: float | None = None
    warmup_durations: list[float] = field(default_factory=list)
    measured: list[RequestRecord] = field(default_factory=list)
    finished_inside: list[RequestRecord] = field(default_factory=list)
    drained: int = 0

    @property
    def closed(self) -> bool:
        return self.close_s is not None

    def sized_s(self, requests: int) -> float | None:
        """SIZE_FACTOR times the expected wall time of `requests` measured requests, from the
        warm-up's request duration (at least min_window_s); None before the warm-up measured one."""
        if self.request_duration_s is None:
            return None
        cycle_s = self.request_duration_s + self.settings.think_per_request_s
        expected = expected_window_s(self.load, requests, cycle_s)
        return None if expected is None else max(self.settings.min_window_s, SIZE_FACTOR * expected)

    def close(self, now: float, reason: str) -> None:
        self.close_s = now
        self.closed_by = reason
        self.on_close()

    def _open(self, now: float) -> None:
        self.open_s = now
        if self.warmup_durations:
            self.request_duration_s = sum(self.warmup_durations) / len(self.warmup_durations)
        limit = self.settings.max_window_s
        if limit is None:
            limit = self.sized_s(self.settings.max_requests or self.settings.min_requests)
        self.limit_s = limit
        self.on_open()

    def _over_budget(self, now: float) -> bool:
        budget = self.settings.time_budget_s
        return budget is not None and now - self.started_s >= budget

    def tick(self, now: float) -> None:
        if self.closed:
            return
        if self.open_s is None:
            if self.warmed >= self.warmup and now - self.started_s >= max(self.settings.warmup_s, self.settings.ramp_s):
                self._open(now)
            elif self._over_budget(now):
                # The budget ran out during the warm-up: an empty window, unresolved.
                self.open_s = now
                self.on_open()
                self.close(now, "budget")
            elif now - self.started_s >= self.settings.ramp_s + (self.settings.max_window_s or self.settings.warmup_timeout_s):
                # The warm-up itself never finished (a stalled server; its time counts from the
                # ramp-up's end, since only requests sent after it warm up): an empty window, whose
                # latency SLOs fail for want of any completed request.
                self.open_s = now
                self.on_open()
                self.close(now, "stall")
            return
        elapsed = now - self.open_s
        n = len(self.measured)
        enough = n >= self.settings.min_requests and elapsed >= self.settings.min_window_s
        if enough and self._settled(now):
            self.close(now, "verdict" if self.judge is not None and n < (self.settings.max_requests or 0) else "requests")
        elif self._failed_early(now, n):
            self.close(now, "verdict")
        elif self.limit_s is not None and elapsed >= self.limit_s:
            self.close(now, "time")
        elif self._over_budget(now):
            self.close(now, "budget")

    def _failed_early(self, now: float, n: int) -> bool:
        """A conclusive failure before the window's minimum: no need to measure on."""
        # A few measured requests first, so that even a step vLLM's gauges fail at once has latency
        # figures to show.
        if self.server_broke is not None and n >= EARLY_SERVER_FAIL_REQUESTS and self.server_broke(now):
            return True
        if self.judge is None or n < self.next_early_check:
            return False
        self.next_early_check = math.ceil(n * RECHECK_GROWTH)
        return self.judge(self.measured, now - (self.open_s or now)) == "fail"

    def _settled(self, now: float) -> bool:
        """True when the window may close: no SLO to settle, a conclusive verdict, or max_requests."""
        n = len(self.measured)
        limit = self.settings.max_requests
        if limit is None or n >= limit:
            return True
        if self.server_undecided is not None and self.server_undecided():
            return False
        if self.judge is None:
            return True
        if n < self.next_check:
            return False
        self.next_check = math.ceil(n * RECHECK_GROWTH)
        return self.judge(self.measured, now - (self.open_s or now)) != "inconclusive"

    def finish(self, rec: RequestRecord) -> bool:
        """Account one finished request; True when it is measured."""
        measured = False
        if self.open_s is None:
            if rec.send_s >= self.started_s + self.settings.ramp_s:
                self.warmed += 1
                if rec.ok:
                    self.warmup_durations.append(rec.e2e_s)
        elif not self.closed:
            self.finished_inside.append(rec)
            if rec.send_s >= self.open_s:
                self.measured.append(rec)
                measured = True
        else:
            self.drained += 1
        self.tick(rec.end_s)
        return measured

    def end_of_arrivals(self, now: float) -> None:
        """A finite schedule (a trace) ran out and its requests finished: the window ends here."""
        if self.closed:
            return
        if self.open_s is None:
            self.open_s = now
            self.on_open()
        self.close(now, "trace_end")

    def abort(self, now: float) -> None:
        """The server went away: the window ends now. Unlike close(), no end snapshot is taken
        (the caller stops sending; the step's partial result is dropped)."""
        self.open_s = self.open_s if self.open_s is not None else now
        self.close_s, self.closed_by = now, "abort"


async def watch(state: WindowState, stop_sending: asyncio.Event, abort: asyncio.Event | None, clock: Callable[[], float]) -> None:
    """Closes a window on time even when no request finishes (max_window_s, min_window_s), and
    at once when `abort` is set."""
    while not state.closed:
        now = clock()
        if abort is not None and abort.is_set():
            state.abort(now)
            stop_sending.set()
            break
        state.tick(now)
        await asyncio.sleep(0.05)


def minimum_window_samples(state: WindowState, samples: int, last_s: float) -> int:
    """How many /metrics samples the window will hold at its minimum: its samples so far, at the
    rate they came, over SIZE_FACTOR times the minimum's expected wall time (expected_window_s,
    which reads short: requests still running when they would be counted are not). 0 when the
    warm-up measured no request duration."""
    expected = state.sized_s(state.settings.min_requests)
    if state.open_s is None or expected is None or last_s <= state.open_s:
        return 0
    return math.floor(samples / (last_s - state.open_s) * expected)


def gauges_broke(scraper: MetricsScraper | None, slo: Mapping[str, float] | None, state: WindowState) -> Callable[[float], bool] | None:
    """Whether vLLM's gauges inside the window already broke a server-side SLO (preemptions,
    KV-cache usage, waiting requests): the step is a failure whatever else it measures."""
    bounds = {k: v for k, v in (slo or {}).items() if k in ("max_preemptions", "kv_cache_usage_max", "max_waiting")}
    if scraper is None or not bounds:
        return None
    seen = 0

    def broke(now: float) -> bool:
        nonlocal seen
        samples = scraper.samples
        if state.open_s is None or len(samples) == seen:
            return False
        seen = len(samples)
        before = [x for x in samples if x.t_s <= state.open_s]
        inside = [x for x in samples if x.t_s > state.open_s]
        if not inside:
            return False
        # The share of the window above the bound (replay.slo.max_rules), once it would stay over the
        # limit even on the samples the minimum window will hold.
        kv_bound = bounds.get("kv_cache_usage_max")
        if kv_bound is not None:
            usage = max_rules.kv_usage_inside(inside, state.open_s)
            if max_rules.kv_verdict_on(usage, kv_bound, minimum_window_samples(state, len(usage), inside[-1].t_s)) == "fail":
                return True
        waiting = [x.waiting for x in inside if x.waiting is not None]
        if "max_waiting" in bounds and waiting and max(waiting) > bounds["max_waiting"]:
            return True
        # A preemption bound of 0 is judged over the first requests (replay.slo.max_rules); a rate at the end.
        within_exposure = bounds.get("max_preemptions") == 0 and len(state.measured) <= max_rules.EXPOSURE_REQUESTS
        if within_exposure and before and before[-1].preemptions is not None:
            last = inside[-1].preemptions
            return last is not None and last - before[-1].preemptions > bounds["max_preemptions"]
        return False

    return broke


def gauges_undecided(scraper: MetricsScraper | None, slo: Mapping[str, float] | None, state: WindowState) -> Callable[[], bool] | None:
    """Whether the KV rule (replay.slo.max_rules) is still undecided on the window's samples so
    far: some sample read the cache above the bound, but too few samples to call it a share; or
    requests finished in the window and no sample yet caught one running, so the samples read the
    engine between its work and their share of 0 says nothing (replay.step.result)."""
    bound = (slo or {}).get("kv_cache_usage_max")
    if scraper is None or bound is None:
        return None

    # Asked at every finished request once the window could close: read again only when a sample
    # came in (or the window opened), as gauges_broke does.
    seen: tuple[int, float | None] | None = None
    last = False

    def undecided() -> bool:
        nonlocal seen, last
        if state.open_s is None:
            return False
        key = (len(scraper.samples), state.open_s)
        if key != seen:
            seen = key
            inside = [x for x in scraper.samples if x.t_s > state.open_s]
            last = max_rules.kv_verdict_on(max_rules.kv_usage_inside(inside, state.open_s), bound) == "inconclusive" or (
                bool(state.measured) and max_rules.saw_no_work(inside)
            )
        return last

    return undecided


def slo_judge(spec, slo: Mapping[str, float], spread: Spread | None = None) -> Callable[[list[RequestRecord], float], str]:
    """The window's verdict on the sample so far, from the client-side SLOs. Server-side SLOs are
    judged on the whole window (and early, on vLLM's gauges, by gauges_broke)."""
    def judge(measured: list[RequestRecord], elapsed_s: float) -> str:
        partial = build_result(
            spec=spec,
            started_at="",
            warmup=0,
            window_s=elapsed_s,
            measured=measured,
            finished_inside=[],
            drained=0,
            server=ServerSummary(),
            client=ClientSummary(),
            slo=slo,
        )
        rule_verdicts, _ = slo_mod.verdicts(partial, slo, latency_samples(measured, spec), spread)
        return slo_mod.step_verdict(rule_verdicts)

    return judge
