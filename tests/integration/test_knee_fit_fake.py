"""One load that passes on a long step and fails on a short one, on the fake server: the result
shows both steps, the search steps one precision step below the contested load (not down to a
low guess), and the knee is read from every step (replay.search.pass_fit)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from replay.corpus.jsonl import load_corpus
from replay.results import LoadSpec, StepResult
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings
from replay.stats.across_steps import MAX_LOG_SD
from tests.fakes.openai_server import Behavior, FakeServer

# TPOT 20 ms against a 100 ms bound: a clear pass even on a busy machine (the fake shares the
# client's event loop), with room for the between-step margin a contested load brings. Each
# request's gaps vary by a lognormal factor (sigma 0.1), as an engine's do, so the test does not
# rest on a step whose TPOT p90 is exact to microseconds (a within-step variance 10^5 below the
# fast step's; replay.stats.across_steps.log_scatter weighs steps by it).
FAST = Behavior(itl_s=0.02, ttft_s=0.002, slowness_sigma=0.1)
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
    def measured(step: StepResult) -> int:
        return step.requests_ok + step.requests_failed + step.steady_state_dropped

    assert measured(long) >= 100 and measured(short) < measured(long)
    assert results.max_passing_concurrency == 9 and results.confirmed
    # Both verdicts at 10 are shown, and the answer is read from every step.
    assert results.contested_concurrency == [10]
    at = {p.concurrency: p for p in results.pass_probability}
    assert (at[10].passes, at[10].steps) == (1, 2) and at[10].probability == 0.5
    assert at[9].probability == 1.0
    assert results.knee_fit == 9 and results.knee_fit_level == 0.9 and results.knee_band == [9, 10]
    # The verdicts rest on the across-step intervals; the contested pair at 10 (20 and 300 ms)
    # brings the between-step margin, capped, to the steps after it.
    assert all("tpot_p90_ms" in s.slo_ci95 and s.slo_tau["tpot_p90_ms"] >= 1 for s in results.steps)
    assert not long.slo_margin_log_sd and results.steps[2].slo_margin_log_sd == {"tpot_p90_ms": MAX_LOG_SD}


class PreemptLate:
    """Turns spurious preemptions on once `after` measured requests have finished."""

    def __init__(self, server: FakeServer, after: int) -> None:
        self.server, self.after, self.measured = server, after, 0

    def step_started(self, load: LoadSpec) -> None:
        pass

    def request_sent(self) -> None:
        pass

    def request_finished(self, record, *, measured: bool) -> None:
        self.measured += measured
        if self.measured == self.after:
            self.server.behavior = replace(self.server.behavior, preemption_rate=0.2)

    def step_finished(self, step: StepResult) -> None:
        pass

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        pass


@pytest.mark.timeout(180)
def test_preemptions_after_the_stated_exposure_do_not_fail_max_preemptions_0(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 4}) + "\n" for i in range(3000)))
    # 300 measured requests; preemptions start after 220 of them, well after the first 100 ended.
    settings = ReplaySettings(concurrency=[4], min_requests=300, max_requests=300, metrics_interval_s=0.2)

    async def main():
        async with FakeServer(FAST) as srv:
            return await run_replay(
                url=srv.url, corpus=load_corpus(corpus), settings=settings,
                slo={"tpot_p90_ms": 1000.0, "max_preemptions": 0.0}, observer=PreemptLate(srv, 220),
            )  # fmt: skip

    (step,) = asyncio.run(main()).steps
    assert step.server.preemptions and step.server.preemptions > 0
    assert step.preemptions_in_exposure == 0
    assert step.preemptions_per_request is not None and step.preemptions_per_request > 0
    lo, hi = step.preemptions_per_request_ci95
    assert 0 < lo < step.preemptions_per_request < hi
    assert step.slo_verdicts["max_preemptions"] == "pass" and step.slo_verdict == "pass"
