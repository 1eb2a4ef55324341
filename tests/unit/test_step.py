"""The step runner against an in-memory sender: in-flight counts, windows, drains, schedules."""

import asyncio
from dataclasses import dataclass

import pytest

from replay.load.drivers import RequestCursor
from replay.load.kinds import Concurrency, PoissonRate, TraceReplay
from replay.records import RequestRecord
from replay.step.run import run_step
from replay.step.window import Window
from tests.fakes.senders import CORPUS, Req, SleepySender
from tests.fakes.virtual_time import run_virtual, virtual_clock


def virtual_step(sender: SleepySender, *args, **kwargs):
    """run_step on a virtual clock: every duration exact, whatever the machine's load."""
    sender.clock = virtual_clock
    return run_virtual(run_step(sender, *args, clock=virtual_clock, **kwargs))


def test_closed_loop_keeps_n_in_flight_and_measures_the_window():
    sender = SleepySender()
    result = virtual_step(sender, RequestCursor(CORPUS), Concurrency(8), Window(min_requests=40), slo={"ttft_p50_ms": 1000})
    assert sender.peak == 8
    assert result.warmup_requests == 8
    assert result.requests_ok + result.steady_state_dropped >= 40 and result.requests_failed == 0
    # everything still running when the window closed was drained, not counted or failed
    assert result.requests_drained >= 1
    assert result.ttft_ms.p50 >= 5.0
    # 8 in flight, 20 ms each: 400 requests/s.
    assert result.requests_per_s == pytest.approx(400, rel=0.05)
    assert result.slo_pass and result.load.mode == "concurrency"
    assert result.server.metrics_available is False


def test_failures_are_counted_by_kind_and_fail_the_error_slo():
    sender = SleepySender(fail_every=5)
    result = asyncio.run(
        run_step(sender, RequestCursor(CORPUS), Concurrency(4), Window(min_requests=30), slo={"error_rate": 0.0})
    )
    assert result.requests_failed > 0
    assert result.errors == {"http_500": result.requests_failed}
    assert result.slo_violations == ["error_rate"] and not result.slo_pass


def test_connect_retries_of_the_measured_requests_are_summed_into_the_client_summary():
    class RetryingSender(SleepySender):
        async def send(self, request, **kwargs) -> RequestRecord:
            rec = await super().send(request, **kwargs)
            rec.connect_retries = 2 if request.id == "r0" else 1  # r0 is a warm-up request
            return rec

    sender = RetryingSender()
    result = virtual_step(sender, RequestCursor(CORPUS), Concurrency(2), Window(warmup_requests=2, min_requests=10))
    assert result.client.connect_retries == result.requests_ok + result.requests_failed > 0


def test_cursor_continues_across_steps():
    cursor = RequestCursor(CORPUS)
    sender = SleepySender()
    asyncio.run(run_step(sender, cursor, Concurrency(1), Window(warmup_requests=0, min_requests=5)))
    first_ids = [rid for _, rid in sender.sent]
    asyncio.run(run_step(sender, cursor, Concurrency(1), Window(warmup_requests=0, min_requests=5)))
    second_ids = [rid for _, rid in sender.sent][len(first_ids):]
    assert first_ids == [f"r{i}" for i in range(5)]
    assert second_ids[0] == "r5"


def test_poisson_rate_is_held_and_lag_is_measured():
    sender = SleepySender(latency_s=0.01, ttft_s=0.002)
    result = virtual_step(sender, RequestCursor(CORPUS), PoissonRate(100.0, seed=1), Window(warmup_requests=5, min_requests=100))
    assert result.load.seed == 1
    # 100 Poisson arrivals at 100/s: within three standard deviations (30%) of the rate.
    assert 70 < result.requests_per_s < 130
    assert result.client.send_lag_p99_ms is not None
    assert result.client.loop_lag_p99_ms is not None


def test_trace_replay_sends_at_the_timestamps_and_ends_with_the_trace():
    sender = SleepySender(latency_s=0.005, ttft_s=0.001)
    result = virtual_step(sender, RequestCursor(CORPUS), TraceReplay(speed=2.0), Window(min_requests=1000), requests=CORPUS)
    times = [t for t, _ in sender.sent]
    # 49 gaps of 10 ms at double speed.
    assert times[-1] - times[0] == pytest.approx(0.245)
    assert result.requests_ok == 50


def test_max_window_closes_a_stalled_step():
    sender = SleepySender(latency_s=0.3, ttft_s=0.1)
    result = virtual_step(
        sender, RequestCursor(CORPUS), Concurrency(2), Window(warmup_requests=0, min_requests=1000, max_window_s=0.5)
    )
    # Closed by the window's clock (it ticks every 50 ms), not by a request.
    assert result.window_closed_by == "time"
    assert 0.5 <= result.window_s <= 0.55
    assert result.requests_ok < 1000


@dataclass
class AlternatingSender(SleepySender):
    """TTFT alternates between 2 ms and 12 ms: its median can be shown neither above nor below 7 ms."""

    async def send(self, request, *, scheduled_s=None) -> RequestRecord:
        self.ttft_s = 0.002 if len(self.sent) % 2 else 0.012
        self.latency_s = self.ttft_s + 0.005
        return await super().send(request, scheduled_s=scheduled_s)


def test_a_window_grows_until_the_p99_can_be_shown_to_pass():
    # 40 requests cannot bound a p99 from above; the window measures on to a finite bound (368+).
    result = asyncio.run(
        run_step(
            SleepySender(latency_s=0.004, ttft_s=0.001), RequestCursor(CORPUS), Concurrency(8),
            Window(min_requests=40, max_requests=2000), slo={"ttft_p99_ms": 1000},
        )
    )
    assert result.slo_verdict == "pass" and result.slo_pass
    assert result.slo_verdicts == {"ttft_p99_ms": "pass"}
    assert 368 <= result.requests_ok + result.steady_state_dropped < 2000
    lo, hi = result.ttft_ms.ci95["p99"]
    assert lo <= result.ttft_ms.p99 and (hi is None or hi <= 1000)


def test_a_conclusive_failure_closes_at_the_minimum():
    result = asyncio.run(
        run_step(
            SleepySender(), RequestCursor(CORPUS), Concurrency(4),
            Window(min_requests=40, max_requests=2000), slo={"ttft_p50_ms": 1.0},
        )
    )
    assert result.slo_verdict == "fail" and result.slo_violations == ["ttft_p50_ms"]
    assert result.requests_ok + result.steady_state_dropped < 60


def test_an_inconclusive_step_stops_at_max_requests_and_does_not_pass():
    result = asyncio.run(
        run_step(
            AlternatingSender(), RequestCursor(CORPUS), Concurrency(4),
            Window(min_requests=40, max_requests=120), slo={"ttft_p50_ms": 7.0},
        )
    )
    assert result.slo_verdict == "inconclusive" and not result.slo_pass
    assert result.slo_violations == ["ttft_p50_ms"]
    assert 120 <= result.requests_ok + result.steady_state_dropped < 140


def test_goodput_counts_requests_that_met_every_bound():
    # Half the requests have a 12 ms TTFT, over the 10 ms bound: attainment about one half.
    result = asyncio.run(
        run_step(
            AlternatingSender(), RequestCursor(CORPUS), Concurrency(4),
            Window(min_requests=200), slo={"ttft_p50_ms": 10.0, "ttft_p99_ms": 10.0},
        )
    )
    assert 0.4 < result.slo_attainment < 0.6
    lo, hi = result.slo_attainment_ci95
    assert lo < result.slo_attainment < hi
    assert result.goodput_requests_per_s == result.requests_per_s * result.slo_attainment
    lo, hi = result.requests_per_s_ci95
    assert lo <= result.requests_per_s <= hi
