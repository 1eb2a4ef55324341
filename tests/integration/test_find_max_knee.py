"""--find-max never over-claims: against a fake server with a known TPOT law, across seeds, the
answer is at most the true knee and within 20% below it where the steps were decided."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from replay.corpus.jsonl import load_corpus
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings

# 12 ms gaps (not 5): a shared 2-core machine's scheduling adds a few ms to each gap, which at
# 5 ms doubled TPOT and moved the knee the client can measure below the range asserted here.
ITL_S = 0.012
GROWTH = 1.0
SIGMA = 0.15
Z99 = 2.3263478740408408
BOUND_MS = 110.0
SEEDS = (1, 2, 3)


def tpot_p99_ms(concurrency: int) -> float:
    """The fake's law: every gap is ITL_S x (1 + GROWTH x running) x a lognormal(0, SIGMA) factor
    drawn per request, and a closed loop keeps `concurrency` running."""
    return ITL_S * 1e3 * (1 + GROWTH * concurrency) * math.exp(SIGMA * Z99)


def true_knee() -> int:
    return max(c for c in range(1, 100) if tpot_p99_ms(c) <= BOUND_MS)


def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 4}) + "\n" for i in range(500)))
    return path


@pytest.mark.timeout(400)
def test_find_max_stays_at_or_below_the_true_knee_across_seeds(tmp_path, spawn_fake_server):
    knee = true_knee()
    # The bound sits between the law at the knee and one above it, a few percent from each.
    assert knee == 5 and tpot_p99_ms(knee) < BOUND_MS < tpot_p99_ms(knee + 1)
    urls = [
        spawn_fake_server(
            "--itl-s", str(ITL_S), "--itl-growth-per-running", str(GROWTH), "--ttft-s", "0.002",
            "--slowness-sigma", str(SIGMA), "--seed", str(seed),
        )
        for seed in SEEDS
    ]
    settings = ReplaySettings(find_max=True, start_concurrency=4, min_requests=100, max_requests=1500)
    prompts = load_corpus(corpus(tmp_path))

    async def all_seeds():
        return await asyncio.gather(
            *(run_replay(url=url, corpus=prompts, settings=settings, slo={"tpot_p99_ms": BOUND_MS}) for url in urls)
        )

    for seed, result in zip(SEEDS, asyncio.run(all_seeds())):
        found = result.max_passing_concurrency
        # Every step, for a failure's reader: the p99 against its own interval and the one judged.
        steps = [
            (s.load.value, s.slo_verdict, s.requests_ok, round(s.tpot_ms.p99 or 0, 1), s.tpot_ms.ci95["p99"], s.slo_ci95)
            for s in result.steps
        ]
        print(f"seed {seed}: {found}", steps)
        assert found is not None and found <= knee, (seed, steps)
        # Within 20% below the knee, unless the search could not decide there: a load between the
        # answer and 80% of the knee may stay inconclusive (on a busy machine the first step's
        # interval at 4 once reached 112 ms against 110), never fail.
        verdicts = {load: {v for ld, v, *_ in steps if ld == load} for load in {st[0] for st in steps}}
        undecided = {load for load, seen in verdicts.items() if seen == {"inconclusive"}}
        short = range(found + 1, math.ceil(0.8 * knee) + 1)
        assert all(load in undecided for load in short), (seed, steps)
        assert result.confirmed
        lo, hi = result.knee_interval
        assert lo == found and (hi is None or hi > knee or hi in undecided), (seed, result.knee_interval, steps)
        # Every pass was shown with a finite upper bound on the p99: at least 368 requests.
        assert all(s.requests_ok + s.steady_state_dropped >= 368 for s in result.steps if s.slo_pass)
