"""Is the point's server still doing anything? A server that dies is seen at once (the launcher
waits on its exit); one that hangs without dying would hold a sweep for ever, one request timeout
after another. Liveness watches for the two ways of doing nothing and says which it saw:

    server_hung       a process of the server's group is stopped (state T: SIGSTOP, a debugger),
                      or /health has not answered HEALTH_FAILURES probes in a row, each within
                      HEALTH_TIMEOUT_S, while the process runs (a stuck API server: the port still
                      accepts connections, nothing answers)
    stream_stalled    /health answers, but STALLED_REQUESTS requests in a row (none completing in
                      between) ended on the read timeout with nothing received for at least half
                      of request_timeout_s (a stuck engine behind a live API server)

Bounds, from the moment the fault begins: a stopped process within PROBE_INTERVAL_S; a silent
/health within HEALTH_FAILURES x (PROBE_INTERVAL_S + HEALTH_TIMEOUT_S); stalled streams within
request_timeout_s when STALLED_REQUESTS or more requests are in flight (at concurrency 1,
STALLED_REQUESTS x request_timeout_s), plus one probe.

A server under load that is merely slow is neither: it answers /health, and its requests complete
(any completed request resets the stall count) or time out while tokens still arrive.

It is a replay observer (request_finished counts the stalled requests) and a task (`watch`) that
returns the Failure once it sees one; the point (planner.sweep.point) runs it beside its search.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from planner.capacity import Failure
from planner.launcher import VllmServer, group_processes
from planner.vllm_log import log_tail
from replay.records import RequestRecord
from replay.results import LoadSpec, StepResult

PROBE_INTERVAL_S = 2.0
# Generous: a vLLM API server under thousands of streams answers /health late, not never.
HEALTH_TIMEOUT_S = 10.0
HEALTH_FAILURES = 3
STALLED_REQUESTS = 3


def stopped_in_group(pgid: int, proc: Path = Path("/proc")) -> list[tuple[int, str]]:
    """(pid, state) of the processes of group `pgid` that are stopped (T) or traced (t)."""
    return [(pid, state) for pid, state, _ in group_processes(pgid, proc) or [] if state in ("T", "t")]


class Liveness:
    def __init__(
        self,
        server: VllmServer,
        *,
        request_timeout_s: float,
        probe_interval_s: float | None = None,
        health_timeout_s: float | None = None,
        health_failures: int | None = None,
        stalled_requests: int | None = None,
    ) -> None:
        # The module's figures when not given, read now (tests shorten them).
        self.server = server
        self.request_timeout_s = request_timeout_s
        self.probe_interval_s = probe_interval_s or PROBE_INTERVAL_S
        self.health_timeout_s = health_timeout_s or HEALTH_TIMEOUT_S
        self.health_failures = health_failures or HEALTH_FAILURES
        self.stalled_requests = stalled_requests or STALLED_REQUESTS
        self._stalled = 0
        self._stall = asyncio.Event()

    @property
    def stalled(self) -> bool:
        """Whether the requests seen so far add up to stalled streams (the watch checks /health)."""
        return self._stall.is_set()

    # --- replay observer: counting stalled requests ------------------------------------------

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None:
        if record.ok:
            self._stalled = 0
            return
        if record.error != "timeout":
            return
        last = record.token_times_s[-1] if record.token_times_s else record.send_s
        if record.end_s - last >= self.request_timeout_s / 2:
            self._stalled += 1
            if self._stalled >= self.stalled_requests:
                self._stall.set()

    def step_started(self, load: LoadSpec) -> None:
        pass

    def request_sent(self) -> None:
        pass

    def step_finished(self, step: StepResult) -> None:
        pass

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        pass

    # --- the watch ----------------------------------------------------------------------------

    async def _health(self, client: httpx.AsyncClient) -> str | None:
        """None when /health answers 200 in time; else what it did."""
        try:
            response = await client.get("/health", timeout=self.health_timeout_s)
        except httpx.TimeoutException:
            return f"no answer within {self.health_timeout_s:g} s"
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if response.status_code == 200 else f"HTTP {response.status_code}"

    def _failure(self, kind: str, message: str) -> Failure:
        return Failure(kind=kind, message=message, log_tail=log_tail(self.server.read_log()))

    async def watch(self) -> Failure:
        """The server's hang or stall, once seen (runs until cancelled while there is none)."""
        failures: list[str] = []
        async with httpx.AsyncClient(base_url=self.server.url, trust_env=False) as client:
            while True:
                pgid = self.server.pgid
                stopped = stopped_in_group(pgid) if pgid is not None else []
                if stopped:
                    pids = ", ".join(f"pid {pid} (state {state})" for pid, state in stopped)
                    return self._failure(
                        "server_hung",
                        f"the server's process group {pgid} has stopped processes: {pids}; a SIGSTOP, a debugger"
                        " or a job-control stop; it can answer nothing",
                    )
                said = await self._health(client)
                if said is None:
                    failures.clear()
                    if self._stall.is_set():
                        return self._failure(
                            "stream_stalled",
                            f"{self._stalled} requests in a row received nothing for at least"
                            f" {self.request_timeout_s / 2:g} s and ended on request_timeout_s ="
                            f" {self.request_timeout_s:g} s, none completing, while /health answered: the engine"
                            " is stuck",
                        )
                elif self.server.alive():
                    failures.append(said)
                    if len(failures) >= self.health_failures:
                        return self._failure(
                            "server_hung",
                            f"/health failed {len(failures)} times in a row ({'; '.join(failures)}) while the"
                            f" server's process (pid {self.server.pid}) runs: it accepts connections but answers"
                            " nothing",
                        )
                try:
                    await asyncio.wait_for(self._stall.wait(), self.probe_interval_s)
                except TimeoutError:
                    pass
