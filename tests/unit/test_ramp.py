"""A closed loop's ramp-up: its workers start evenly over one request duration, and the window
opens no sooner."""

import asyncio

import pytest

from replay.load.drivers import RequestCursor
from replay.load.kinds import Concurrency, PoissonRate
from replay.records import RequestRecord
from replay.results import LatencySummary, LoadSpec
from replay.run.runner import RAMP_BUDGET_SHARE, Replay, ramp_for
from replay.run.settings import ReplaySettings
from replay.step.run import run_step
from replay.step.window import Window, WindowState
from tests.fakes.results import make_step
from tests.fakes.senders import CORPUS, SleepySender
from tests.fakes.virtual_time import run_virtual, virtual_clock


def ramped_step(sender: SleepySender, load, window: Window, **kwargs):
    sender.clock = virtual_clock
    return run_virtual(run_step(sender, RequestCursor(CORPUS), load, window, clock=virtual_clock, **kwargs))


def first_sends(sender: SleepySender, n: int) -> list[float]:
    return sorted(t for t, _ in sender.sent)[:n]


def test_the_workers_start_evenly_over_the_ramp():
    sender = SleepySender(latency_s=0.5, ttft_s=0.01)
    result = ramped_step(sender, Concurrency(4), Window(min_requests=20, ramp_s=0.4))
    assert first_sends(sender, 4) == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert result.ramp_s == 0.4


def test_without_a_ramp_every_worker_sends_at_once():
    sender = SleepySender(latency_s=0.5, ttft_s=0.01)
    result = ramped_step(sender, Concurrency(4), Window(min_requests=20))
    assert first_sends(sender, 4) == [0.0] * 4
    assert result.ramp_s == 0.0


def test_the_window_opens_no_sooner_than_the_ramp_ends():
    # Four 20 ms requests finish long before a 1 s ramp ends: the warm-up's count alone would open
    # the window at 20 ms.
    sender = SleepySender(latency_s=0.02, ttft_s=0.005)
    result = ramped_step(sender, Concurrency(4), Window(warmup_requests=4, min_requests=20, ramp_s=1.0))
    sent = [t for t, _ in sender.sent]
    assert result.requests_ok + result.steady_state_dropped >= 20
    # Every measured request was sent after the ramp: at 4 in flight and 20 ms each, the requests
    # sent from 1 s on number about 200 per second.
    assert sum(t >= 1.0 for t in sent) >= 20


def record(send_s: float, end_s: float) -> RequestRecord:
    return RequestRecord(
        request_id="r", send_s=send_s, end_s=end_s, first_token_s=send_s + 0.01, token_times_s=[send_s + 0.01, end_s],
        prompt_tokens=10, completion_tokens=2,
    )


def test_a_window_state_with_its_warmup_done_waits_for_the_ramp():
    state = WindowState(warmup=2, settings=Window(ramp_s=5.0), started_s=0.0, on_close=lambda: None)
    state.warmed = 2
    state.tick(4.9)
    assert state.open_s is None
    state.tick(5.0)
    assert state.open_s == 5.0


def test_requests_sent_during_the_ramp_count_neither_to_the_warmup_nor_to_its_duration():
    # Sent while few workers ran, they read short: a window sized from them ran out of time at 60
    # in flight on vLLM with 3 requests measured.
    state = WindowState(
        warmup=2, settings=Window(ramp_s=5.0, max_window_s=None, min_requests=10), started_s=0.0,
        on_close=lambda: None, load=Concurrency(4),
    )
    for send_s in (0.0, 1.25, 2.5, 3.75):
        state.finish(record(send_s, send_s + 0.5))
    state.tick(5.0)
    assert state.open_s is None and state.warmed == 0
    state.finish(record(5.0, 8.0))
    state.finish(record(5.5, 9.0))
    assert state.open_s == 9.0
    assert state.request_duration_s == pytest.approx(3.25)


def test_a_stop_during_the_ramp_ends_the_step_without_the_waiting_workers():
    sender = SleepySender(latency_s=0.02, ttft_s=0.005)
    abort = asyncio.Event()

    async def step():
        asyncio.get_running_loop().call_later(0.5, abort.set)
        return await run_step(
            sender, RequestCursor(CORPUS), Concurrency(10), Window(min_requests=20, ramp_s=100.0),
            abort=abort, clock=virtual_clock,
        )

    sender.clock = virtual_clock
    run_virtual(step())
    # Workers 0 (at 0 s) and nothing later than 0.5 s sent; the nine waiting for 10-90 s never did.
    assert {rid for _, rid in sender.sent} and max(t for t, _ in sender.sent) < 0.5


def test_an_open_loop_has_no_ramp():
    sender = SleepySender(latency_s=0.01, ttft_s=0.002)
    result = ramped_step(sender, PoissonRate(100.0, seed=1), Window(warmup_requests=5, min_requests=30, ramp_s=2.0))
    assert result.ramp_s == 0.0


def step_at(n: int, duration_s: float | None, mode: str = "concurrency", *, e2e_mean_ms: float | None = None):
    """A step at n whose requests lasted `duration_s` by Little's law (n finished a duration)."""
    e2e = LatencySummary(mean=e2e_mean_ms, p50=None, p90=None, p95=None, p99=None, max=None)
    return make_step(
        load=LoadSpec(mode=mode, value=n), e2e_ms=e2e, requests_per_s=n / duration_s if duration_s else 0.0
    )


def test_the_ramp_is_the_request_duration_of_the_step_nearest_in_load():
    steps = [step_at(20, 1.0), step_at(50, 3.0), step_at(40, 2.5), step_at(40, 2.6)]
    assert ramp_for(steps, 48, None) == pytest.approx(3.0)
    # Two steps as near: the latest.
    assert ramp_for(steps, 41, None) == pytest.approx(2.6)
    assert ramp_for(steps, 45, None) == pytest.approx(2.6)
    # A setting wins, 0 included; no closed-loop step measured yet: at once.
    assert ramp_for(steps, 48, 0.0) == 0.0
    assert ramp_for(steps, 48, 7.5) == 7.5
    assert ramp_for([], 48, None) == 0.0
    assert ramp_for([step_at(5, 0.9, mode="rate"), step_at(30, None)], 48, None) == 0.0


def test_the_duration_is_the_load_over_the_throughput_not_the_measured_requests_mean():
    # A window drains the requests sent late that were still running when it closed, so its
    # measured requests' mean end-to-end time reads short of the loop's cycle: 50 in flight
    # finishing 10 a second last 5 s each, whatever the measured mean says.
    assert ramp_for([step_at(50, 5.0, e2e_mean_ms=2600)], 50, None) == pytest.approx(5.0)
    # With no request finished in the window, the measured mean is all there is.
    assert ramp_for([step_at(50, None, e2e_mean_ms=2600)], 50, None) == pytest.approx(2.6)


def test_a_ramp_takes_at_most_a_share_of_what_is_left_of_the_budget():
    corpus = type("Corpus", (), {"requests": CORPUS, "sessions": None})()
    replay = Replay(None, corpus, ReplaySettings(request_order="file"), {}, known_steps=[step_at(50, 40.0)])
    assert replay.ramp(Concurrency(50), Window()) == 40.0
    assert replay.ramp(Concurrency(50), Window(time_budget_s=100.0)) == RAMP_BUDGET_SHARE * 100.0
    assert replay.ramp(PoissonRate(5.0, seed=0), Window()) == 0.0


def test_the_warmup_deadline_counts_from_the_ramps_end():
    # A window of at most 0.3 s also bounds its warm-up: counted from the step's start, a 0.12 s
    # ramp left the warm-up 0.18 s, and a step at 2 in flight on 0.1 s requests stalled.
    state = WindowState(
        warmup=2, settings=Window(ramp_s=0.12, max_window_s=0.3), started_s=0.0, on_close=lambda: None,
    )
    state.tick(0.35)
    assert state.closed_by is None
    state.tick(0.42)
    assert state.closed_by == "stall"
