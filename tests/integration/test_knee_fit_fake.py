"""One load that passes on a long step and fails on a short one, on the fake server: the result
shows both steps, the search steps one precision step below the contested load (not down to a
low guess), and the knee is read from every step (replay.pass_fit)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from replay.corpus import load_corpus
from replay.results import LoadSpec, StepResult
from replay.session import run_replay
from replay.settings import ReplaySettings
from tests.fakes.openai_server import Behavior, FakeServer

# TPOT 20 ms against a 100 ms bound: a clear pass even on a busy machine (the fake shares the
# client's event loop), with room for the between-step margin a contested load brings.
FAST = Behavior(itl_s=0.02, ttft_s=0.002)
# Fifteen times slower: TPOT 300 ms, a conclusive failure in a short window.
SLOW = replace(FAST, itl_s=0.3)


class SlowForOneStep:
    """Makes the server slow for the second step only: the confirmation of the first."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.finished = 0

    def step_started(self, load: LoadSpec) -> None:
        self.server.behavior = SLOW if self.finished == 1 else FAST

    def request_sent(self) -> None:
        pass

    def request_finished(self, record, *, measured: bool) -> None:
        pass

    def step_finished(self, step: StepResult) -> None:
        self.finished += 1

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        pass


@pytest.mark.timeout(180)
def test_a_load_that_passes_long_and_fails_short_is_shown_and_the_knee_comes_from_the_fit(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 4}) + "\n" for i in range(3000)))
    settings = ReplaySettings(find_max=True, start_concurrency=10, max_concurrency=10, max_requests=200)

    async def main():
        async with FakeServer(FAST) as srv:
            return await run_replay(
                url=srv.url, corpus=load_corpus(corpus), settings=settings,
                slo={"tpot_p90_ms": 100.0}, observer=SlowForOneStep(srv),
            )  # fmt: skip

    results = asyncio.run(main())
    order = [(int(s.load.value), s.slo_verdict) for s in results.steps]
    # 10 passed on a full window, failed its confirmation early; the next probe is one step below.
    detail = [(o, s.tpot_ms.p90, s.slo_ci95, s.requests_ok, s.window_closed_by) for o, s in zip(order, results.steps)]
    assert order[:3] == [(10, "pass"), (10, "fail"), (9, "pass")], detail
    long, short = results.steps[0], results.steps[1]
    assert long.requests_ok >= 100 and short.requests_ok < long.requests_ok
    assert results.max_passing_concurrency == 9 and results.confirmed
    # Both verdicts at 10 are shown, and the answer is read from every step.
    assert results.contested_concurrency == [10]
    at = {p.concurrency: p for p in results.pass_probability}
    assert (at[10].passes, at[10].steps) == (1, 2) and at[10].probability == 0.5
    assert at[9].probability == 1.0
    assert results.knee_fit == 9 and results.knee_fit_level == 0.9 and results.knee_band == [9, 10]
