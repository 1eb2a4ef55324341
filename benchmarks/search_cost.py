"""What a point costs: the old search order (doubling from 1, then bisection) against the new one
(start at the saturation probe's count, model each SLO against load, narrow down), side by side.

The fake server (its own process) follows a known law at a scaled timescale:
ITL = 20 ms x (1 + 0.05 x running) = 20 ms + 1 ms per running request, and every request asks
for 15 tokens (0.3 s at concurrency 1, about 1 s at the knee). That is a twentieth of a GPU
point's timescale (300 tokens at 20 ms: 6 s a request). Longer gaps and fewer tokens than the
issue's 2 ms + 0.02 ms law keep the client's chunk rate (about 700 chunks/s at the knee) and the
machine's scheduling jitter (a few ms on a shared 2-core machine) small against the law's slope,
so the knee the client can measure is the law's. Under tpot_p99_ms = 70.5 the law's knee is 50
(TPOT 70 ms at 50 running, 71 at 51); 10% below it is 5 ms of TPOT.

Both arms run the same step rules (windows sized from the warm-up, long enough to finish; the
early close of a conclusive failure; the steady-state rule) and confirm their knee, so the ratio
isolates the search order. Each seed runs its own fake server; old and new take turns per seed.

Prints, per seed and arm: wall time, steps, requests measured and sent, those the steady-state
rule dropped, the answer and whether it
is within [0.9 x knee, knee]; then the ratio of wall times. Run:
    .venv/bin/python benchmarks/search_cost.py [--seeds 1,2,3,4,5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay.client.streaming import StreamingClient  # noqa: E402
from replay.corpus.jsonl import load_corpus  # noqa: E402
from replay.load.kinds import Concurrency  # noqa: E402
from replay.results import StepResult  # noqa: E402
from replay.run.runner import Replay, search_start  # noqa: E402
from replay.run.settings import ReplaySettings  # noqa: E402
from replay.search.policy import bracket, next_probe  # noqa: E402
from tests.fakes.openai_server import start_process  # noqa: E402

ITL_S, GROWTH, TTFT_S, TOKENS = 0.020, 0.05, 0.020, 15
BOUND_MS = 70.5
SLO = {"tpot_p99_ms": BOUND_MS}


def law_tpot_ms(running: int) -> float:
    return ITL_S * 1e3 * (1 + GROWTH * running)


def law_knee() -> int:
    return max(c for c in range(1, 10_000) if law_tpot_ms(c) <= BOUND_MS)


def start_fake(log: Path, seed: int) -> tuple[subprocess.Popen, str]:
    return start_process(
        log, "--itl-s", str(ITL_S), "--itl-growth-per-running", str(GROWTH), "--ttft-s", str(TTFT_S), "--seed", str(seed)
    )


def sent(steps: list[StepResult]) -> tuple[int, int]:
    measured = sum(s.requests_ok + s.requests_failed + s.steady_state_dropped for s in steps)
    total = measured + sum(s.warmup_requests + s.requests_drained for s in steps)
    return measured, total


async def one_arm(url: str, corpus_path: Path, arm: str) -> dict:
    corpus = load_corpus(corpus_path)
    settings = ReplaySettings(find_max=True)
    async with StreamingClient(url, model=None, api="completions", max_connections=4100, request_timeout_s=120) as client:
        await client.check()
        replay = Replay(client, corpus, settings, SLO)
        t0 = time.perf_counter()
        if arm == "new":
            start, _ = await search_start(replay, settings)
            outcome = await replay.search(start=start, upper=None)
            answer = outcome.max_passing
        else:
            # The old order: doubling from 1, then bisection (no ratios given, so no model).
            history: list[tuple[int, bool]] = []
            while (n := next_probe(history, start=1, confirm=True)) is not None:
                step = await replay.step(Concurrency(n))
                history.append((n, step.slo_pass))
            answer = bracket(history).max_passing
        wall = time.perf_counter() - t0
    measured, total = sent(replay.steps)
    return {
        "arm": arm,
        "wall_s": wall,
        "steps": len(replay.steps),
        "measured": measured,
        "sent": total,
        "answer": answer,
        "order": [int(s.load.value) for s in replay.steps],
        "low_c_s": sum(s.window_s for s in replay.steps if s.load.value <= 8),
        "dropped": sum(s.steady_state_dropped for s in replay.steps),
        "detail": [
            (int(s.load.value), s.slo_verdict, round(s.tpot_ms.p99 or 0, 1), round(law_tpot_ms(int(s.load.value)), 1))
            for s in replay.steps
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3,4,5", help="seeds, one fake server each (default 1,2,3,4,5)")
    parser.add_argument("--arms", default="new,old", help="which search orders to run (default new,old)")
    args = parser.parse_args()
    knee = law_knee()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": TOKENS}) + "\n" for i in range(3000)))
        for seed in (int(s) for s in args.seeds.split(",")):
            for arm in args.arms.split(","):
                proc, url = start_fake(Path(tmp) / f"fake-{seed}-{arm}.log", seed)
                try:
                    row = asyncio.run(one_arm(url, corpus, arm))
                finally:
                    proc.terminate()
                    proc.wait()
                row["seed"] = seed
                rows.append(row)
                print(f"seed {seed} {arm}: {row['wall_s']:.0f} s, answer {row['answer']}; steps (concurrency,"
                      f" verdict, TPOT p99 ms, law ms): {row['detail']}", flush=True)
    print()
    print(f"law: TPOT = {ITL_S * 1e3:g} ms x (1 + {GROWTH:g} x running), {TOKENS} tokens a request; "
          f"tpot_p99_ms <= {BOUND_MS:g}; knee {knee}; an answer is right in [{math.ceil(0.9 * knee)}, {knee}]")
    print(f"{'seed':>4} {'arm':>4} {'wall s':>7} {'steps':>5} {'measured':>8} {'sent':>6} {'dropped':>7} {'s at c<=8':>9} {'answer':>6} {'right':>5}  order")
    for r in rows:
        right = r["answer"] is not None and math.ceil(0.9 * knee) <= r["answer"] <= knee
        print(f"{r['seed']:>4} {r['arm']:>4} {r['wall_s']:>7.0f} {r['steps']:>5} {r['measured']:>8} {r['sent']:>6} {r['dropped']:>7}"
              f" {r['low_c_s']:>9.0f} {str(r['answer']):>6} {'yes' if right else 'NO':>5}  {r['order']}")
    old = [r for r in rows if r["arm"] == "old"]
    new = [r for r in rows if r["arm"] == "new"]
    if not old or not new:
        return 0
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    print(f"mean per point: old {mean(old, 'wall_s'):.0f} s, {mean(old, 'steps'):.1f} steps, {mean(old, 'sent'):.0f} requests;"
          f" new {mean(new, 'wall_s'):.0f} s, {mean(new, 'steps'):.1f} steps, {mean(new, 'sent'):.0f} requests;"
          f" wall time old/new x{mean(old, 'wall_s') / mean(new, 'wall_s'):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
