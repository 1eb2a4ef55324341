"""One step: a load held against the server, a warm-up, a measurement window, and the drain.

Three parts, each in its own place:
- when to send: the load's driver (replay.load.drivers: a closed loop, an open loop on a Poisson
  or trace schedule; a session corpus's arrivals are whole conversations, replay.load.conversation);
- when to stop: the window (replay.step.window), fed every finished request and a clock tick;
- what it measured: one pure function of the records, vLLM's metric snapshots and the SLOs
  (replay.step.result);
- what else ran: the environment watch (replay.step.environment), told when the window opens and
  closes, judges afterwards whether other processes disturbed the step.

This module wires them: it sends each request through the client, accounts it to the window and
the observer, and scrapes /metrics around the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from replay.load.conversation import SessionRunner, ThinkTime
from replay.load.drivers import RequestCursor, drive
from replay.load.kinds import Concurrency, Load
from replay.records import RequestRecord
from replay.results import StepResult, updated
from replay.server.crosscheck import TTFT_EXCESS_FRACTION, TTFT_EXCESS_MS
from replay.server.metrics import MetricsScraper
from replay.step.environment import EnvironmentWatch
from replay.step.observer import Observers, ReplayObserver
from replay.step.result import MetricSnapshots, StepRecords, step_result
from replay.step.window import Window, WindowState, gauges_broke, gauges_undecided, slo_judge, watch

LOOP_TICK_S = 0.01


class Sender(Protocol):
    # Session turns also pass keep_text=True (keep the reply's text for the history).
    async def send(self, request, *, scheduled_s: float | None = None) -> RequestRecord: ...


class RequestPath:
    """Every request of a step goes through here: sent by the client, then accounted to the
    window and the observer, with its lateness against its schedule."""

    def __init__(self, client: Sender, state: WindowState, observer: ReplayObserver) -> None:
        self.client = client
        self.state = state
        self.observer = observer
        self.send_lags: list[float] = []
        # When every request of the step finished (warm-up and drain included), to count the
        # client's finished requests between the server's two snapshots.
        self.finish_times: list[float] = []

    async def send(
        self, req, scheduled_s: float | None, *, keep_text: bool = False,
        annotate: Callable[[RequestRecord], None] | None = None,
    ) -> RequestRecord:
        self.observer.request_sent()
        # keep_text only when asked, so senders of plain corpora need not know it.
        options = {"keep_text": True} if keep_text else {}
        rec = await self.client.send(req, scheduled_s=scheduled_s, **options)
        if annotate is not None:
            annotate(rec)
        self.finish_times.append(rec.end_s)
        if scheduled_s is not None:
            self.send_lags.append(max(0.0, rec.send_s - scheduled_s))
        self.observer.request_finished(rec, measured=self.state.finish(rec))
        return rec


async def _loop_lag(lags: list[float], stop: asyncio.Event, clock: Callable[[], float]) -> None:
    while not stop.is_set():
        t = clock()
        await asyncio.sleep(LOOP_TICK_S)
        lags.append(max(0.0, clock() - t - LOOP_TICK_S))


def window_state(
    load: Load, window: Window, stop_sending: asyncio.Event, scraper: MetricsScraper | None,
    slo: dict[str, float] | None, started_s: float, environment: EnvironmentWatch | None = None,
) -> WindowState:
    """The step's window, wired to stop the sending, to snapshot vLLM's histograms and to tell
    the environment watch the moment it opens and closes."""

    def window_opened() -> None:
        if scraper is not None:
            scraper.mark("start")
        if environment is not None:
            environment.window_opened()

    def window_closed() -> None:
        stop_sending.set()
        if scraper is not None:
            scraper.mark("end")
        if environment is not None:
            environment.window_closed()

    state = WindowState(
        warmup=window.warmup_for(load),
        settings=window,
        started_s=started_s,
        on_close=window_closed,
        load=load,
        on_open=window_opened,
        judge=slo_judge(load.spec(), slo, window.spread) if slo else None,
    )
    state.server_broke = gauges_broke(scraper, slo, state)
    state.server_undecided = gauges_undecided(scraper, slo, state)
    return state


@contextlib.asynccontextmanager
async def _watched(
    state: WindowState, stop_sending: asyncio.Event, abort: asyncio.Event | None, scraper: MetricsScraper | None,
    loop_lags: list[float], clock: Callable[[], float],
) -> AsyncIterator[None]:
    """While the load is sent: the window's clock, the event loop's lag, and /metrics scraped;
    after it (however it ended), sending stopped and all three stopped."""
    lag_stop = asyncio.Event()
    lag_task = asyncio.create_task(_loop_lag(loop_lags, lag_stop, clock))
    clock_task = asyncio.create_task(watch(state, stop_sending, abort, clock))
    if scraper is not None:
        scraper.start()
    cancelled = False
    try:
        yield
    except asyncio.CancelledError:
        # The step is dropped (its server hung, or the planner stops): nothing below may wait on
        # the server.
        cancelled = True
        raise
    finally:
        stop_sending.set()
        lag_stop.set()
        clock_task.cancel()
        for task in (lag_task, clock_task):
            try:
                await task
            except asyncio.CancelledError:
                pass
        if scraper is not None:
            # A server known to be gone or hung answers no scrape: the window's marks are not waited for.
            await scraper.stop(cancel_marks=cancelled or (abort is not None and abort.is_set()))


async def run_step(
    client: Sender,
    cursor: RequestCursor,
    load: Load,
    window: Window,
    *,
    requests: Sequence | None = None,
    sessions: Sequence | None = None,
    think: ThinkTime | None = None,
    scraper: MetricsScraper | None = None,
    observer: ReplayObserver | None = None,
    slo: dict[str, float] | None = None,
    abort: asyncio.Event | None = None,
    ttft_excess: tuple[float, float] = (TTFT_EXCESS_MS, TTFT_EXCESS_FRACTION),
    clock: Callable[[], float] = time.perf_counter,
    environment: EnvironmentWatch | None = None,
) -> StepResult:
    """Run one step and return its result. `requests` is the corpus (trace replay needs it whole).

    With `sessions` (a session corpus's replay.corpus.jsonl.Session list), the cursor hands out
    sessions, the load counts sessions (replay.load.conversation), and `think` sets the think times.

    Setting `abort` stops sending at once and closes the window; requests in flight end by
    themselves (they are not cancelled: cancelling a connect midway leaks its socket).

    `environment` (replay.step.environment) is told when the window opens and closes, and the
    result keeps what it saw and whether that disturbed the step.

    `clock` must be the one the client stamps its records with (perf_counter for the real one; a
    test's virtual clock for a test's sender).
    """
    obs = observer or Observers()
    obs.step_started(load.spec())
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    stop_sending = asyncio.Event()
    state = window_state(load, window, stop_sending, scraper, slo, clock(), environment)
    path = RequestPath(client, state, obs)
    runner = SessionRunner(path.send, think or ThinkTime(), stop_sending, clock) if sessions is not None else None
    loop_lags: list[float] = []
    async with _watched(state, stop_sending, abort, scraper, loop_lags, clock):
        ran_out = await drive(
            load, path.send if runner is None else runner.run, cursor, stop_sending,
            arrivals=sessions if sessions is not None else requests, max_inflight=window.max_inflight, clock=clock,
            ramp_s=window.ramp_s,
        )
        if ran_out:
            state.end_of_arrivals(clock())
    records = StepRecords(
        load=load, started_at=started_at, warmup=state.warmup, open_s=state.open_s, close_s=state.close_s,
        closed_by=state.closed_by, limit_s=state.limit_s, request_duration_s=state.request_duration_s,
        measured=state.measured, finished_inside=state.finished_inside, drained=state.drained,
        finish_times=path.finish_times, send_lags=path.send_lags, loop_lags=loop_lags,
    )
    metrics = MetricSnapshots.of(scraper) if scraper is not None else None
    result = step_result(
        records, metrics, slo, max_requests=window.max_requests, min_requests=window.min_requests,
        sessions=runner, ttft_excess=ttft_excess, spread=window.spread,
    )
    if isinstance(load, Concurrency) and window.ramp_s > 0:
        result = updated(result, ramp_s=round(window.ramp_s, 3))
    if environment is not None:
        seen, disturbed = environment.judge()
        result = updated(result, environment=seen, disturbed=disturbed)
    obs.step_finished(result)
    return result
