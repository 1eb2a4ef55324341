"""In-memory senders for step tests: requests that take a set time, on any clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from replay.records import RequestRecord


@dataclass
class Req:
    id: str
    timestamp_s: float | None = None


@dataclass
class SleepySender:
    """Each request takes `latency_s`; the first token arrives after `ttft_s`. Times come from
    `clock` (tests.fakes.virtual_time.virtual_clock makes them exact)."""

    latency_s: float = 0.02
    ttft_s: float = 0.005
    fail_every: int = 0
    clock: Callable[[], float] = time.perf_counter
    inflight: int = 0
    peak: int = 0
    sent: list = field(default_factory=list)
    # Every request object as sent (session turns: their messages).
    requests: list = field(default_factory=list)

    async def send(self, request, *, scheduled_s=None, keep_text=False) -> RequestRecord:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        self.sent.append((self.clock(), request.id))
        self.requests.append(request)
        start = self.clock()
        try:
            await asyncio.sleep(self.ttft_s)
            first = self.clock()
            await asyncio.sleep(self.latency_s - self.ttft_s)
            end = self.clock()
        finally:
            self.inflight -= 1
        error = "http_500" if self.fail_every and len(self.sent) % self.fail_every == 0 else None
        return RequestRecord(
            request_id=request.id, send_s=start, end_s=end, first_token_s=None if error else first,
            token_times_s=[] if error else [first, end], prompt_tokens=10, completion_tokens=2,
            error=error, scheduled_s=scheduled_s, output_text=f"reply to {request.id}" if keep_text else None,
        )


CORPUS = [Req(f"r{i}", timestamp_s=i * 0.01) for i in range(50)]
