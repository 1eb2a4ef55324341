"""The runner of steps against one server: the planned loads, then the search, each step as the
search stage asks for it. `planner replay` (replay.run.entry) and the sweep's points drive it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from replay.client.streaming import StreamingClient
from replay.corpus.jsonl import Corpus
from replay.errors import StepAborted
from replay.load.conversation import SessionCursor, ThinkTime, mean_think_per_request_s, turn_request
from replay.load.drivers import RequestCursor
from replay.load.kinds import Concurrency, Load, PoissonRate, TraceReplay
from replay.load.order import send_order
from replay.results import StepResult
from replay.run.settings import ReplaySettings
from replay.search.eta import search_eta_s
from replay.search.policy import bracket, disturbed, next_probe, unresolved
from replay.search.saturation import first_probe, saturation_probe
from replay.search.verdicts import concurrency_history, probe_of
from replay.server.metrics import MetricsScraper
from replay.stats.across_steps import spread_of
from replay.step.environment import CpuProbe, EnvironmentWatch, WindowProbe
from replay.step.observer import ReplayObserver
from replay.step.run import run_step
from replay.step.window import Window

# How long the scrapes at the window's edges may take. The counters' changes across the window
# (preemptions, vLLM's histograms) are read from them, and a server busy with a full batch on few
# cores answers /metrics slowly: a periodic scrape may give up sooner, these should not.
MARK_TIMEOUT_S = 30.0
# A ramp-up takes at most this share of what is left of the point's budget.
RAMP_BUDGET_SHARE = 0.25


def ramp_for(steps: Sequence[StepResult], n: int, setting: float | None) -> float:
    """A closed loop of n's ramp-up: `setting` when set; else one request duration measured by
    the closed-loop step nearest n in load (the latest of equals); 0 before any such step."""
    if setting is not None:
        return setting
    measured = [
        (abs(step.load.value - n), -i, duration)
        for i, step in enumerate(steps)
        if step.load.mode == "concurrency" and (duration := request_duration(step))
    ]
    return min(measured)[2] if measured else 0.0


def request_duration(step: StepResult) -> float | None:
    """A closed-loop step's mean request duration in seconds, by Little's law: its load over the
    requests it finished a second. The window's measured requests would read short, since those
    sent late and still running when it closed are drained, not measured."""
    if step.requests_per_s > 0:
        return step.load.value / step.requests_per_s
    return step.e2e_ms.mean / 1000 if step.e2e_ms.mean else None


class StepMonitor(Protocol):
    """Runs around each step (the sweep samples GPU memory with one); `peak_mib` is copied into
    the step's gpu_memory_peak_mib."""

    peak_mib: dict[str, float]

    async def __aenter__(self) -> object: ...

    async def __aexit__(self, *exc: object) -> None: ...


def planned_loads(settings: ReplaySettings) -> list[Load]:
    loads: list[Load] = [Concurrency(n) for n in settings.concurrency]
    loads += [PoissonRate(r, settings.seed + i) for i, r in enumerate(settings.rate)]
    if settings.trace:
        loads.append(TraceReplay(settings.trace_speed))
    return loads


class Replay:
    """Runs steps against one server with one client and one corpus cursor.

    The sweep drives it too: `search()` with the capacity bound as `upper`.
    """

    def __init__(
        self,
        client: StreamingClient,
        corpus: Corpus,
        settings: ReplaySettings,
        slo: dict[str, float],
        *,
        observer: ReplayObserver | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        step_monitor: Callable[[], StepMonitor] | None = None,
        probes: Callable[[], list[WindowProbe]] | None = None,
        server_start: int | None = None,
        known_steps: Sequence[StepResult] = (),
        prompt_tokens: Sequence[int] | None = None,
    ) -> None:
        self.client = client
        # Steps measured on the same point before this run (a first start's, for a fresh server's
        # confirmation): with the run's own, they size a closed loop's ramp-up (ramp_for).
        self.known_steps = list(known_steps)
        # Which start of the server the steps run on ([sweep] server_starts); each step carries it,
        # and an undecided step is pooled only with the steps of its own start.
        self.server_start = server_start
        self.corpus = corpus
        self.settings = settings
        self.slo = slo
        self.observer = observer
        self.on_step = on_step
        self.step_monitor = step_monitor
        # What each step's window watches (replay.step.environment): the caller's probes (the
        # server's processes and CPUs), else the CPUs with the server unknown; plus the step
        # monitor when it is a probe too (the sweep's GPU sampler).
        self.probes = probes or (lambda: [CpuProbe()])
        # A session corpus is replayed session by session: the load counts users (replay.load.conversation).
        self.cursor = (
            SessionCursor(corpus.sessions)
            if corpus.sessions is not None
            # The server tokenizer's prompt counts, where the caller has them, balance the order on
            # what the KV cache really holds (replay.load.order).
            else RequestCursor(send_order(corpus.requests, settings.request_order, settings.max_tokens, prompt_tokens))
        )
        self.think = ThinkTime(settings.think_time_s, settings.think_time_distribution, settings.seed)
        self.think_per_request_s = (
            mean_think_per_request_s(corpus.sessions, self.think) if corpus.sessions is not None else 0.0
        )
        self.steps: list[StepResult] = []
        # Set when the server is known to be gone: the step running stops sending, its partial
        # result is dropped, and StepAborted is raised.
        self.abort = asyncio.Event()

    async def step(self, load: Load, window: Window | None = None) -> StepResult:
        scraper = MetricsScraper(
            self.client.metrics_text, interval_s=self.settings.metrics_interval_s, model=self.client.model,
            fetch_mark=functools.partial(self.client.metrics_text, timeout_s=MARK_TIMEOUT_S),
        )
        monitor = self.step_monitor() if self.step_monitor is not None else contextlib.nullcontext()
        probes = self.probes()
        if isinstance(monitor, WindowProbe):
            probes.append(monitor)
        environment = EnvironmentWatch(probes, self.settings.interference())
        window = window or self.settings.window(self.slo)
        async with monitor:
            result = await run_step(
                self.client,
                self.cursor,
                load,
                replace(
                    window,
                    think_per_request_s=self.think_per_request_s,
                    ramp_s=self.ramp(load, window),
                    # Judged across steps: the tau and between-step spread of the steps so far.
                    spread=spread_of(
                        self.steps, self.slo, load.n if isinstance(load, Concurrency) else None, start=self.server_start
                    )
                    if self.slo
                    else None,
                ),
                requests=self.corpus.requests,
                sessions=self.corpus.sessions,
                think=self.think,
                scraper=scraper,
                observer=self.observer,
                slo=self.slo,
                abort=self.abort,
                ttft_excess=(self.settings.client_ttft_excess_ms, self.settings.client_ttft_excess_fraction),
                environment=environment,
            )
        if self.abort.is_set():
            raise StepAborted(f"the step at {load.label()} was aborted: the server went away")
        peak = getattr(monitor, "peak_mib", None)
        if peak:
            result.gpu_memory_peak_mib = dict(peak)
        result.server_start = self.server_start
        self.steps.append(result)
        if self.on_step is not None:
            self.on_step(result)
        return result

    def ramp(self, load: Load, window: Window) -> float:
        if not isinstance(load, Concurrency):
            return 0.0
        ramp_s = ramp_for([*self.known_steps, *self.steps], load.n, self.settings.ramp_s)
        if window.time_budget_s is not None:
            ramp_s = min(ramp_s, RAMP_BUDGET_SHARE * window.time_budget_s)
        return ramp_s

    async def run_planned(self) -> None:
        for load in planned_loads(self.settings):
            await self.step(load)

    async def search(
        self, *, start: int, upper: int | None, pooled: int = 0, confirm: bool | None = None
    ) -> SearchOutcome:
        """The search from `start` (a capacity bound, or the saturation probe's count), capped by
        `upper`, within [replay] point_budget_s. `pooled`: how many of `self.steps` an earlier
        server start of the point measured (planner.sweep.point); the search goes on from them,
        and its highest pass must pass again on this start. `confirm` overrides [replay]
        confirm_knee (a tie-break start's one pass at the others' knee is its answer there)."""
        settings = self.settings
        confirm = settings.confirm_knee if confirm is None else confirm
        began = time.perf_counter()
        budget = settings.point_budget_s
        history = concurrency_history(self.steps, self.slo)
        confirm_from = len(concurrency_history(self.steps[:pooled]))
        budget_exhausted = False
        while (
            n := next_probe(
                history, start=start, upper=upper, rel_precision=settings.precision, confirm=confirm,
                disturbed_retries=settings.disturbed_retries, confirm_from=confirm_from,
            )
        ) is not None:
            window = self.settings.window(self.slo)
            left = None if budget is None else budget - (time.perf_counter() - began)
            if left is not None and left <= 0:
                budget_exhausted = True
                break
            # An unresolved concurrency measured again gets twice the time each time.
            misses = sum(1 for p in history if p.concurrency == n and p.verdict == "unresolved")
            if misses:
                earlier = [s.window_limit_s for s in self.steps if s.load.mode == "concurrency" and int(s.load.value) == n]
                longest = max((w for w in earlier if w), default=window.max_window_s)
                if longest is not None:
                    window = replace(window, max_window_s=longest * 2**misses)
            if left is not None:
                window = replace(window, time_budget_s=left)
            if self.observer is not None:
                eta = search_eta_s(
                    self.steps, history, n,
                    min_requests=window.min_requests, rel_precision=settings.precision, confirm=confirm,
                )
                self.observer.probe_planned(n, eta)
            result = await self.step(Concurrency(n), window)
            history.append(probe_of(result, self.slo))
        outcome = outcome_of(history)
        outcome.budget_exhausted = budget_exhausted
        return outcome


@dataclass
class SearchOutcome:
    max_passing: int | None = None
    min_failing: int | None = None
    # Concurrencies that only ever ran out of time (below the lowest failure).
    unresolved: list[int] = field(default_factory=list)
    # Concurrencies whose every step was disturbed (replay.step.environment).
    disturbed: list[int] = field(default_factory=list)
    budget_exhausted: bool = False


def outcome_of(history: list) -> SearchOutcome:
    """What a search's steps (as probes) bracket, and the loads they left unresolved or disturbed."""
    b = bracket(history)
    return SearchOutcome(
        max_passing=b.max_passing,
        min_failing=b.min_failing,
        unresolved=[c for c in unresolved(history) if b.min_failing is None or c < b.min_failing],
        disturbed=disturbed(history),
    )


def pooled_outcome(steps: list[StepResult]) -> SearchOutcome:
    """`outcome_of` every closed-loop step of `steps`: a point's several server starts together."""
    return outcome_of(concurrency_history(steps))


async def search_start(replay: Replay, settings: ReplaySettings) -> tuple[int, str]:
    """The first probe of `planner replay --find-max`, and why: start_concurrency when given,
    else max_concurrency, else the saturation probe's count."""
    if settings.start_concurrency is not None:
        return settings.start_concurrency, "start_concurrency"
    if settings.max_concurrency is not None:
        return settings.max_concurrency, "max_concurrency"
    cursor = replay.cursor
    if replay.corpus.sessions is not None:
        # A session corpus probes with first turns: a burst of sessions' opening requests.
        cursor = RequestCursor([turn_request(s.turns[0], []) for s in replay.corpus.sessions])
    probe = await saturation_probe(replay.client, cursor, settings.saturation_requests)
    return first_probe(probe, replay.slo)
