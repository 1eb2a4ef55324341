"""What the adaptive strategy saves, and whether it keeps the answer: whole sweeps of the fake vLLM
with [sweep] strategy = "adaptive" and "exhaustive" on the same grid, per seed, side by side.

The fake (tests/fakes/fake_vllm.py) follows a known law. ITL = 20 ms x (1 + g x running), where
g = 0.5 x max_num_batched_tokens / 2048: three speed classes (256, 1024 and 4096 tokens a step),
whose latency knees under tpot_p50_ms = 75 are floor(2.75 / g) = 44, 11 and 2. Each class has
four pools (kv_cache_memory_bytes 4M, 2M, 256K, 128K: 128, 64, 8 and 4 blocks of 128 tokens, one
corpus request each) and three max_num_seqs caps (64, 8, 3; above the cap requests wait for a
slot, which max_waiting = 0 forbids, and ttft_max_ms = 150 sees): 36 points. A point's true max passing concurrency is
min(latency knee, blocks, max_num_seqs); its safe concurrency floor(0.8 x that) (headroom 0.2).
Two pools hold the fastest class's knee (44). The search of the first stops once its bracket is
within its precision (5%, two loads there); where the bracket is wider than one load, the second's
prediction could still win, and it is verified by measurement.

Prints, per seed and strategy: wall time, points searched / verified / predicted / dominated,
fallbacks, the recommendation with its true safe concurrency per GPU against the law's best
(right when within 5%), and each prediction checked by measurement (verified, or fallen back to a
full search) against the point's measured knee and the law's. Then
the ratio of wall times. Each sweep is its own `planner sweep` process. Timings are only worth
anything on a quiet machine. Run:
    .venv/bin/python benchmarks/adaptive_sweep.py [--seeds 1,2,3] [--strategies adaptive,exhaustive]
    .venv/bin/python benchmarks/adaptive_sweep.py --tiny     # 4 points, one seed: that it runs
"""

from __future__ import annotations

import argparse
import itertools
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.sweep.results import SweepResults  # noqa: E402
from tests.fakes.sweep_files import write_corpus, write_sweep_config  # noqa: E402

ITL_S, GROWTH_AT_2048, TPOT_BOUND_MS, HEADROOM = 0.020, 0.5, 75.0, 0.2
BLOCK_BYTES = 128 * 256  # 128 tokens x the fake's 256 bytes a token at tp 1
GRID = {
    "max_num_batched_tokens": [256, 1024, 4096],
    "kv_cache_memory_bytes": ["4M", "2M", "256K", "128K"],
    "max_num_seqs": [64, 8, 3],
}
TINY_GRID = {"max_num_batched_tokens": [2048, 4096], "kv_cache_memory_bytes": ["4M", "128K"], "max_num_seqs": [64]}


def kv_bytes(text: str) -> int:
    return int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]]


def latency_knee(max_num_batched_tokens: int) -> int:
    growth = GROWTH_AT_2048 * max_num_batched_tokens / 2048
    return math.floor((TPOT_BOUND_MS / 1e3 / ITL_S - 1) / growth + 1e-9)


def true_max_passing(config: dict) -> int:
    blocks = kv_bytes(config["kv_cache_memory_bytes"]) // BLOCK_BYTES
    return min(latency_knee(config["max_num_batched_tokens"]), blocks, config["max_num_seqs"])


def true_safe(config: dict) -> int:
    return math.floor(true_max_passing(config) * (1 - HEADROOM))


def write_config(folder: Path, grid: dict, strategy: str, seed: int) -> Path:
    return write_sweep_config(
        folder,
        corpus=write_corpus(folder / "corpus.jsonl", n=200),
        env={"FAKE_VLLM_ITL_S": str(ITL_S), "FAKE_VLLM_ITL_GROWTH": str(GROWTH_AT_2048), "FAKE_VLLM_TTFT_S": "0.005"},
        grid={"max_model_len": [128]},
        extra=grid,
        replay={"seed": seed, "start_concurrency": 4, "min_requests": 20, "max_window_s": 60, "request_timeout_s": 30},
        # max_waiting = 0 makes max_num_seqs a cap on what passes (planner.sweep.laws.waiting_allowed).
        slo={"tpot_p50_ms": TPOT_BOUND_MS, "ttft_max_ms": 150, "max_waiting": 0, "error_rate": 0, "headroom": HEADROOM},
        more={"sweep": {"strategy": strategy}},
        model=f"adaptive-bench-{strategy}-{seed}",
        startup_timeout_s=60,
        args=["--enforce-eager", "--seed", str(seed)],
    )


def one_sweep(folder: Path, grid: dict, strategy: str, seed: int) -> dict:
    folder.mkdir(parents=True)
    cfg = write_config(folder, grid, strategy, seed)
    out = folder / "out"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "sweep", "--config", str(cfg), "--output", str(out)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{strategy} seed {seed}: planner sweep exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    results = SweepResults.model_validate_json((out / "sweep.json").read_text())
    counts = {k: 0 for k in ("searched", "verified", "predicted", "dominated")}
    for p in results.points:
        if p.answer_source in counts:
            counts[p.answer_source] += 1
    best = next((p for p in results.points if results.best and p.id == results.best.point_id), None)
    # Every prediction checked by measurement: verified, or fallen back to a full search.
    checked = [
        (p.id, p.knee_prediction.concurrency, p.max_passing_concurrency, true_max_passing(p.config), p.knee_prediction.verified)
        for p in results.points
        if p.knee_prediction is not None and p.knee_prediction.verified is not None
    ]
    return {
        "strategy": strategy,
        "seed": seed,
        "wall_s": wall,
        **counts,
        "fallbacks": results.adaptive.fallbacks if results.adaptive else 0,
        "best": best.id if best else None,
        "best_true_safe": true_safe(best.config) if best else None,
        "best_measured_safe": best.safe_concurrency_per_gpu if best else None,
        "checked_points": checked,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3", help="seeds, each a sweep per strategy (default 1,2,3)")
    parser.add_argument("--strategies", default="adaptive,exhaustive", help="(default adaptive,exhaustive)")
    parser.add_argument("--tiny", action="store_true", help="a 4-point grid and one seed: check that it runs")
    args = parser.parse_args()
    grid = TINY_GRID if args.tiny else GRID
    seeds = [1] if args.tiny else [int(s) for s in args.seeds.split(",")]
    configs = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    law_best = max(true_safe(c) for c in configs)
    classes = len(grid["max_num_batched_tokens"])
    print(f"grid: {len(configs)} points, {classes} speed classes; law: TPOT = {ITL_S * 1e3:g} ms x (1 + g x running),"
          f" knees {[latency_knee(m) for m in grid['max_num_batched_tokens']]}; law's best safe concurrency per GPU {law_best}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for strategy in args.strategies.split(","):
                row = one_sweep(Path(tmp) / f"{strategy}-{seed}", grid, strategy, seed)
                rows.append(row)
                print(f"seed {seed} {strategy}: {row['wall_s']:.0f} s, best {row['best']}", flush=True)
    print()
    print(f"{'seed':>4} {'strategy':>10} {'wall s':>7} {'searched':>8} {'verified':>8} {'predicted':>9} {'dominated':>9}"
          f" {'fallbacks':>9} {'best true safe':>14} {'law best':>8} {'right':>5}  best")
    for r in rows:
        right = r["best_true_safe"] is not None and r["best_true_safe"] >= 0.95 * law_best
        print(f"{r['seed']:>4} {r['strategy']:>10} {r['wall_s']:>7.0f} {r['searched']:>8} {r['verified']:>8} {r['predicted']:>9}"
              f" {r['dominated']:>9} {r['fallbacks']:>9} {str(r['best_true_safe']):>14} {law_best:>8} {'yes' if right else 'NO':>5}  {r['best']}")
        for pid, predicted, measured, law, agreed in r["checked_points"]:
            close = measured is not None and abs(predicted - measured) <= 0.1 * measured
            how = "verified" if agreed else "fell back to a full search"
            print(f"     {pid}: predicted {predicted}, {how}, measured {measured}, law {law}"
                  f" ({'within' if close else 'NOT within'} 10% of the measured)")
    by = {s: [r for r in rows if r["strategy"] == s] for s in ("adaptive", "exhaustive")}
    if by["adaptive"] and by["exhaustive"]:
        mean = lambda rs: sum(r["wall_s"] for r in rs) / len(rs)  # noqa: E731
        print(f"mean wall time: exhaustive {mean(by['exhaustive']):.0f} s, adaptive {mean(by['adaptive']):.0f} s;"
              f" exhaustive/adaptive x{mean(by['exhaustive']) / mean(by['adaptive']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
