"""The saturation probe against an in-memory server that runs at most `slots` requests at once."""

import asyncio
from dataclasses import dataclass

from replay.load.drivers import RequestCursor
from replay.records import RequestRecord
from replay.results import LatencySummary
from replay.search.saturation import MAX_TOKENS, Saturation, first_probe, saturation_probe


@dataclass(slots=True)
class Req:
    id: str
    max_tokens: int | None = None


class QueueingServer:
    def __init__(self, slots: int, metrics: bool = True) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.running = 0
        self.waiting = 0
        self.metrics = metrics
        self.max_tokens_seen: list[int | None] = []

    async def send(self, request, *, scheduled_s=None) -> RequestRecord:
        self.max_tokens_seen.append(request.max_tokens)
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            self.running += 1
            loop = asyncio.get_running_loop()
            start = loop.time()
            await asyncio.sleep(0.3)
            self.running -= 1
        return RequestRecord(request_id=request.id, send_s=start, end_s=start + 0.3)

    async def metrics_text(self) -> str | None:
        if not self.metrics:
            return None
        return f"vllm:num_requests_running {self.running}\nvllm:num_requests_waiting {self.waiting}\n"


def test_a_server_that_queues_is_started_at_the_most_it_ran_at_once():
    server = QueueingServer(slots=10)
    cursor = RequestCursor([Req(f"r{i}", max_tokens=500 if i % 2 else None) for i in range(100)])
    probe = asyncio.run(saturation_probe(server, cursor, 40))
    assert probe.running_peak == 10 and probe.waiting_peak > 0
    assert probe.start == 10 and "at most 10 together" in probe.reason
    # The burst's requests are short: at most MAX_TOKENS each, whatever the corpus asks.
    assert set(server.max_tokens_seen) == {MAX_TOKENS}


def test_a_server_that_takes_the_whole_burst_starts_the_search_there():
    probe = asyncio.run(saturation_probe(QueueingServer(slots=1000), RequestCursor([Req("a")]), 30))
    assert probe.waiting_peak == 0 and probe.start == 30 and "ran all 30" in probe.reason


def test_without_vllm_gauges_the_burst_size_is_the_start():
    probe = Saturation(requests=64, running_peak=None, waiting_peak=None, duration_s=1.0, failed=0)
    assert probe.start == 64 and "no vLLM gauges" in probe.reason


def test_a_burst_whose_tpot_breaks_the_slo_starts_the_search_lower():
    tpot = LatencySummary(mean=200.0, p50=190.0, p90=240.0, p99=300.0, max=310.0)
    probe = Saturation(requests=256, running_peak=256, waiting_peak=0, duration_s=3.0, failed=0, tpot_ms=tpot)
    start, reason = first_probe(probe, {"tpot_p99_ms": 100.0, "ttft_p99_ms": 10.0})
    # TTFT is left out (a burst queues its own prefills): only TPOT's 3x counts.
    assert start == 85 and "3.00 x the SLO" in reason
    assert first_probe(probe, {"tpot_p99_ms": 400.0}) == (256, probe.reason)
    assert first_probe(probe, {"e2e_p99_ms": 1.0}) == (256, probe.reason)
