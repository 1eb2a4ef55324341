"""Monotonic time only: a step measured while the wall clock steps (a time-sync correction of an
hour, forwards and back, at every reading) has the same window and figures as one measured on a
steady clock. Windows, timeouts and the liveness probes run on perf_counter and the event loop's
monotonic clock; the wall clock only labels results (started_at)."""

from __future__ import annotations

import asyncio
import time

import pytest

from replay.client.streaming import StreamingClient
from replay.corpus.jsonl import load_corpus
from replay.load.drivers import RequestCursor
from replay.load.kinds import Concurrency
from replay.step.run import run_step
from replay.step.window import Window
from tests.fakes.openai_server import Behavior, FakeServer
from tests.fakes.sweep_files import ROOT, write_corpus


def stepping_wall_clock(monkeypatch) -> None:
    """time.time and time.time_ns jump by an hour at every reading: +1 h, -1 h, +1 h, ..."""
    real, real_ns = time.time, time.time_ns
    offsets: list[float] = []

    def offset() -> float:
        offsets.append(3600.0 if len(offsets) % 2 == 0 else -3600.0)
        return offsets[-1]

    monkeypatch.setattr(time, "time", lambda: real() + offset())
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(offset() * 1e9))


async def measure(corpus) -> tuple:
    behavior = Behavior(ttft_s=0.02, itl_s=0.01, output_tokens=6)
    async with FakeServer(behavior) as srv, StreamingClient(srv.url, model=None, max_connections=8, request_timeout_s=5) as client:
        return await run_step(
            client, RequestCursor(corpus.requests), Concurrency(4), Window(warmup_requests=4, min_requests=24, max_window_s=5),
            slo={"error_rate": 0.0},
        )


@pytest.mark.timeout(60)
def test_a_step_measured_while_the_wall_clock_steps_has_the_steady_figures(tmp_path, monkeypatch):
    corpus = load_corpus(write_corpus(tmp_path / "corpus.jsonl"))
    steady = asyncio.run(measure(corpus))
    stepping_wall_clock(monkeypatch)
    stepped = asyncio.run(measure(corpus))
    assert stepped.slo_pass and steady.slo_pass
    assert stepped.window_closed_by == steady.window_closed_by
    # Each request: TTFT 20 ms, then 5 gaps of 10 ms (6 tokens). An hour's jump in either would
    # show as thousands of seconds.
    for result in (steady, stepped):
        assert 0 < result.window_s < 5
        assert 15 <= result.ttft_ms.p50 < 200
        assert 8 <= result.itl_ms.p50 < 100
        assert 4 / 0.5 < result.requests_per_s < 4 / 0.05
    assert stepped.window_s == pytest.approx(steady.window_s, rel=0.5)
    assert stepped.requests_per_s == pytest.approx(steady.requests_per_s, rel=0.5)


def test_durations_are_never_taken_from_the_wall_clock():
    """The planner and replay read the wall clock only to label results: every datetime.now() is
    an ISO timestamp or a file name's stamp, and time.time() is not called at all."""
    for folder in ("planner", "replay"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if "time.time(" in line or "time.time_ns(" in line:
                    pytest.fail(f"{path.relative_to(ROOT)}:{n}: time.time() measures on a clock that can step: {line.strip()}")
                if "datetime.now(" in line:
                    assert ".isoformat(" in line or ".strftime(" in line, f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
