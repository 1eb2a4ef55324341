"""A later server start's undecided step is judged on its own start's steps, on the fake server
(replay.stats.across_steps.spread_of's `start`): pooled with a faster earlier start's steps it
would pass on that start's speed, as on the seventh CPU demo run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from replay.corpus.jsonl import load_corpus
from replay.load.kinds import Concurrency
from replay.results import LatencySummary, LoadSpec, StepResult
from replay.run.runner import Replay
from replay.run.settings import ReplaySettings
from tests.fakes.openai_server import Behavior, FakeServer
from tests.fakes.results import make_step

SLO = {"tpot_p90_ms": 100.0}


def first_start(load: int, p90: float) -> StepResult:
    """A step of the earlier, faster start: TPOT p90 well under the bound, a tight interval."""
    return make_step(
        load=LoadSpec(mode="concurrency", value=load), requests_ok=100, requests_failed=0, slo_verdict="pass",
        slo_tau={"tpot_p90_ms": 2.0}, server_start=1,
        tpot_ms=LatencySummary(p90=p90, ci95={"p90": [p90 * 0.9, p90 * 1.1]}),
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_a_slower_later_starts_undecided_step_does_not_pass_on_the_earlier_starts_steps(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 4}) + "\n" for i in range(500)))
    # Ten measured requests: a p90 cannot pass alone (all ten under the bound happen 35% of the
    # time where the true p90 is the bound), so the step is undecided unless its neighbours decide.
    settings = ReplaySettings(min_requests=10, max_requests=10, warmup_requests=2)
    earlier = [first_start(10, 20.0), first_start(11, 21.0), first_start(12, 22.0)]

    async def main() -> dict[int | None, StepResult]:
        # The later start takes twice as long per token as the earlier one: TPOT about 40 ms.
        async with FakeServer(Behavior(itl_s=0.04, ttft_s=0.002)) as srv:
            async with settings.client(srv.url, model=None, api_key=None, max_connections=16) as client:
                out = {}
                for start in (None, 2):
                    replay = Replay(client, load_corpus(corpus), settings, SLO, server_start=start)
                    replay.steps = list(earlier)
                    out[start] = await replay.step(Concurrency(10))
                return out

    steps = asyncio.run(main())
    # Read as one start with the earlier steps, the step passes on them ...
    mixed = steps[None]
    assert mixed.slo_verdict == "pass", (mixed.tpot_ms, mixed.slo_ci95)
    assert mixed.slo_pooled["tpot_p90_ms"].loads == [10.0, 10.0, 11.0, 12.0]
    # ... on start 2, its own first step, it stays undecided and says which start it ran on.
    own = steps[2]
    assert own.server_start == 2 and own.requests_ok == 10
    assert own.slo_verdict == "inconclusive" and own.slo_pooled == {}, (own.tpot_ms, own.slo_ci95)
    assert 30.0 < own.tpot_ms.p90 < 100.0
