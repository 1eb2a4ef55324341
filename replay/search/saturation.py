"""Where a search without a capacity bound starts: a short saturation probe.

`planner replay --find-max` against a running server knows nothing of its KV pool or batch limit.
Doubling up from one request would spend most of the search where the server is idle, and those
are the dearest steps to measure (a step's wall time is about requests x duration / concurrency).
So the probe sends one burst of N requests at once and reads vLLM's gauges while they run: when
some requests had to wait, the most the server ran at once is the concurrency above which
requests queue, an upper bracket for the knee; when none waited, the server took the whole burst.
Each request of the burst asks for at most `MAX_TOKENS` tokens, so the burst lasts a prefill and
a few dozen decode steps (about a second on a GPU), not whole answers. Short answers hold less KV
cache than the corpus's, so a KV-bound server may run more of them: the count can overshoot,
which costs one cheap failing step, never a wrong answer. The requests come from the same cursor
as the steps', so no later step repeats them.

The burst also shows the decode rate at that load: when its TPOT (a request's mean gap between
tokens) already breaks a TPOT SLO by a factor r, the search starts at count / r instead (`first_probe`): under a ratio proportional
to load that is where the SLO would hold, and since latency has a floor that does not grow with
load, the real crossing lies below it, so the first step is still above the knee and fails
cheaply, but not at the far end of the range. TTFT, ITL and end-to-end latency are left out: a
burst sent at once queues and interleaves its own prefills, which steady traffic does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass, replace

from replay.records import RequestRecord
from replay.results import LatencySummary
from replay.server.metrics import parse_sample
from replay.stats import samples as stats

SCRAPE_EVERY_S = 0.1
TPOT_KEY = re.compile(r"^tpot_(mean|p50|p90|p95|p99|max)_ms$")
# Tokens each request of the burst asks for at most.
MAX_TOKENS = 32


@dataclass(frozen=True)
class Saturation:
    requests: int
    # Peaks of vLLM's num_requests_running / num_requests_waiting during the burst (None: no metrics).
    running_peak: float | None
    waiting_peak: float | None
    # Mean end-to-end duration of the burst's successful requests.
    duration_s: float | None
    failed: int
    # The burst's per-request TPOT.
    tpot_ms: LatencySummary | None = None

    @property
    def start(self) -> int:
        """The concurrency the search starts at."""
        if self.waiting_peak and self.running_peak:
            return max(1, int(self.running_peak))
        return self.requests

    @property
    def reason(self) -> str:
        if self.running_peak is None:
            return f"saturation probe: {self.requests} requests at once (the server exports no vLLM gauges)"
        if self.waiting_peak:
            return (
                f"saturation probe: of {self.requests} requests sent at once the server ran at most"
                f" {self.running_peak:g} together, the others waited"
            )
        return f"saturation probe: the server ran all {self.requests} requests sent at once"


async def saturation_probe(client, cursor, requests: int) -> Saturation:
    """Send `requests` corpus requests at once and watch vLLM's running and waiting gauges."""
    running: list[float] = []
    waiting: list[float] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(Exception):  # a missed scrape only thins the gauges' sample
                text = await client.metrics_text()
                sample = parse_sample(text, 0.0) if text else None
                if sample is not None:
                    if sample.running is not None:
                        running.append(sample.running)
                    if sample.waiting is not None:
                        waiting.append(sample.waiting)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), SCRAPE_EVERY_S)

    watcher = asyncio.create_task(watch())
    try:
        burst = [_short(cursor.next()) for _ in range(requests)]
        records: list[RequestRecord] = await asyncio.gather(*(client.send(r) for r in burst))
    finally:
        done.set()
        await watcher
    ok = [r for r in records if r.ok]
    return Saturation(
        requests=requests,
        running_peak=max(running) if running else None,
        waiting_peak=max(waiting) if waiting else None,
        duration_s=sum(r.e2e_s for r in ok) / len(ok) if ok else None,
        failed=len(records) - len(ok),
        tpot_ms=stats.summarize(stats.tpot_ms(ok)) if ok else None,
    )


def first_probe(probe: Saturation, slo: dict[str, float]) -> tuple[int, str]:
    """Where the search starts after the probe, and why (see the module's docstring)."""
    worst = 1.0
    for key, bound in slo.items():
        match = TPOT_KEY.match(key)
        if match is None or probe.tpot_ms is None or bound <= 0:
            continue
        value = getattr(probe.tpot_ms, match.group(1))
        if value is not None:
            worst = max(worst, value / bound)
    if worst <= 1.0:
        return probe.start, probe.reason
    start = max(1, int(probe.start / worst))
    return start, f"{probe.reason}; its decode latency was {worst:.2f} x the SLO there, so from {probe.start} / {worst:.2f}"


def _short(request):
    return replace(request, max_tokens=min(request.max_tokens or MAX_TOKENS, MAX_TOKENS))
