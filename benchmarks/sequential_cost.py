"""What conclusive verdicts cost: requests measured per step, fixed window versus sequential.

Against the fake server (its own process) with a known TPOT law, every gap is
ITL x (1 + running) x a per-request lognormal(0, 0.15) factor, under a bound tpot_p99_ms = 46 whose
true knee is 5 in flight. Each concurrency is measured twice, one step after the other:

- before: a fixed 100-request window judged on the point p99 (the planner's old rule);
- after: the SLO's own minimum (368 for a p99), then judged on its 95% interval, measuring on
  (fresh prompts) while inconclusive, up to max_requests (4 x the minimum).

Prints per concurrency: the true p99, requests measured and the verdict of each, and whether the
verdict was right. Run: .venv/bin/python benchmarks/sequential_cost.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay.client.streaming import StreamingClient  # noqa: E402
from replay.corpus.jsonl import load_corpus  # noqa: E402
from replay.load.drivers import RequestCursor  # noqa: E402
from replay.load.kinds import Concurrency  # noqa: E402
from replay.run.settings import ReplaySettings  # noqa: E402
from replay.slo import rules as slo_mod  # noqa: E402
from replay.step.run import run_step  # noqa: E402
from replay.step.window import Window  # noqa: E402
from tests.fakes.openai_server import start_process  # noqa: E402

ITL_S, GROWTH, SIGMA, BOUND_MS = 0.005, 1.0, 0.15, 46.0
Z99 = 2.3263478740408408
SLO = {"tpot_p99_ms": BOUND_MS}


def true_p99_ms(c: int) -> float:
    return ITL_S * 1e3 * (1 + GROWTH * c) * math.exp(SIGMA * Z99)


def start_fake(log: Path) -> tuple[subprocess.Popen, str]:
    return start_process(
        log, "--itl-s", str(ITL_S), "--itl-growth-per-running", str(GROWTH), "--ttft-s", "0.002",
        "--slowness-sigma", str(SIGMA), "--seed", "11",
    )


async def measure(url: str, corpus_path: Path, concurrencies: list[int], rounds: int) -> list[dict]:
    corpus = load_corpus(corpus_path)
    cursor = RequestCursor(corpus.requests)
    fixed = Window(min_requests=100)
    sequential = ReplaySettings().window(SLO)
    rows = []
    async with StreamingClient(url, model=None, api="completions", max_connections=64, request_timeout_s=60) as client:
        await client.check()
        for _ in range(rounds):
            for c in concurrencies:
                before = await run_step(client, cursor, Concurrency(c), fixed, slo=SLO)
                after = await run_step(client, cursor, Concurrency(c), sequential, slo=SLO)
                truth = "pass" if true_p99_ms(c) <= BOUND_MS else "fail"
                old_violations, _ = slo_mod.evaluate(before, SLO)
                rows.append({
                    "c": c,
                    "truth": truth,
                    "true_p99": true_p99_ms(c),
                    "before_n": before.requests_ok + before.requests_failed + before.steady_state_dropped,
                    "before_verdict": "fail" if old_violations else "pass",
                    "before_p99": before.tpot_ms.p99,
                    "after_n": after.requests_ok + after.requests_failed + after.steady_state_dropped,
                    "after_verdict": after.slo_verdict,
                    "after_p99": after.tpot_ms.p99,
                    "after_ci": after.tpot_ms.ci95["p99"] if after.tpot_ms.ci95 else None,
                })
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="times each concurrency is measured (default 2)")
    parser.add_argument("--concurrency", default="2,4,5,6,8", help="concurrencies to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 4}) + "\n" for i in range(2000)))
        proc, url = start_fake(Path(tmp) / "fake.log")
        try:
            rows = asyncio.run(measure(url, corpus, [int(c) for c in args.concurrency.split(",")], args.rounds))
        finally:
            proc.terminate()
            proc.wait()
    print(f"TPOT p99 bound {BOUND_MS:g} ms; true knee 5. n = requests measured in the step.")
    print(f"{'c':>3} {'true p99':>9} | {'fixed n':>7} {'p99':>6} {'verdict':>8} {'right':>5} | "
          f"{'seq n':>6} {'p99':>6} {'95% CI':>16} {'verdict':>12} {'wrong':>5}")
    for r in rows:
        ci = r["after_ci"]
        ci_text = "-" if ci is None else f"[{ci[0] or 0:.1f}, {'?' if ci[1] is None else f'{ci[1]:.1f}'}]"
        print(
            f"{r['c']:>3} {r['true_p99']:>9.1f} | {r['before_n']:>7} {r['before_p99']:>6.1f} {r['before_verdict']:>8}"
            f" {'yes' if r['before_verdict'] == r['truth'] else 'NO':>5} | {r['after_n']:>6} {r['after_p99']:>6.1f}"
            f" {ci_text:>16} {r['after_verdict']:>12}"
            # Inconclusive is never wrong: it counts as a failure and claims nothing.
            f" {'NO' if r['after_verdict'] not in (r['truth'], 'inconclusive') else 'no':>5}"
        )
    before = sum(r["before_n"] for r in rows)
    after = sum(r["after_n"] for r in rows)
    wrong_before = sum(r["before_verdict"] != r["truth"] for r in rows)
    wrong_after = sum(r["after_verdict"] not in (r["truth"], "inconclusive") for r in rows)
    print(f"requests per step: fixed {before / len(rows):.0f}, sequential {after / len(rows):.0f} "
          f"(x{after / before:.2f}); wrong verdicts: fixed {wrong_before}/{len(rows)}, sequential {wrong_after}/{len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
