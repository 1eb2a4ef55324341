"""Repeatability: the same point's search K times, and K fixed-load steps at one load.

A team sizes a fleet on one run's answer; this measures how far a second run's would differ, and
whether each step's stated 95% intervals hold across steps. It prints:

- each search's answer (max passing concurrency), steps and wall time, then the answers' spread
  as max - min and as a share of their median, and the median steps and time per search;
- over K steps at one load (run in one sequence, as a point's steps are): for each client
  percentile SLO figure, the coverage of the step's own interval (`ci95`, today's intervals)
  and of the interval its verdict rests on (`slo_ci95`, replay.stats.across_steps): the share
  that contain the pooled estimate (the request-weighted mean of the steps' estimates);
- how often one load got opposite verdicts: over every load measured at least twice (all the
  searches' steps and the fixed ones), how many had both a pass and a fail, and how many a pass
  and an inconclusive step, and the verdicts at the fixed load.

Targets:
- `--target fake` (the default): the fake server as its own process, one per search, at
  search_cost.py's scaled timescale (ITL = 20 ms x (1 + 0.05 x running), 15 tokens a request)
  with per-request lognormal noise (`--slowness-sigma`), a factor shared by each step's requests
  and drawn anew per step (`--step-sigma`; the fake draws it when a request finds it idle for
  `--step-idle-s`, shorter than the pause between two steps), and spurious preemptions
  (`--preemption-rate`, per request per request running). SLO tpot_p90_ms = 70.5 and max_preemptions = 0 by default.
  With `--kv-cache-tokens N` the fake also has a KV pool of N tokens, and a request that finds it
  full is preempted, as on vLLM: preemptions from a pool that fills (340 puts its knee at 26-27
  with closed loops ramped up, near 24 with every worker started at once; under TPOT's 34; add
  kv_cache_usage_max=0.95 to `--slo` for the CPU demo's rules).
- `--target url --url URL --corpus PATH`: a running server, for example the CPU demo's 32M point
  (examples/cpu-demo.toml: start its vLLM with --kv-cache-memory-bytes 32M --max-model-len 12288
  and pass prompts/prod.jsonl); the SLO defaults to that demo's, and `--start 59` starts each
  search where the sweep does (the KV pool's bound).

Figures are only meaningful with nothing else running on the machine. Run:
    .venv/bin/python benchmarks/repeatability.py --searches 5 --steps 10
The fake's searches are seeded (search i with `--seed` + i), so two runs with the same seed
replay much the same draws; for independent runs give each its own `--seed` (100, 200, 300).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay.client.streaming import StreamingClient  # noqa: E402
from replay.corpus.jsonl import load_corpus  # noqa: E402
from replay.load.kinds import Concurrency  # noqa: E402
from replay.results import StepResult  # noqa: E402
from replay.run.runner import Replay, search_start  # noqa: E402
from replay.run.settings import ReplaySettings  # noqa: E402
from replay.search import pass_fit  # noqa: E402
from replay.slo import rules as slo_mod  # noqa: E402
from replay.stats.across_steps import percentile_rule  # noqa: E402
from tests.fakes.openai_server import start_process  # noqa: E402

ITL_S, GROWTH, TTFT_S, TOKENS = 0.020, 0.05, 0.020, 15
FAKE_SLO = "tpot_p90_ms=70.5,max_preemptions=0"
DEMO_SLO = "ttft_p90_ms=8000,tpot_p90_ms=30,e2e_p90_ms=40000,error_rate=0,max_preemptions=0,kv_cache_usage_max=0.95"


def start_fake(log: Path, seed: int, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    return start_process(
        log,
        "--itl-s", str(ITL_S), "--itl-growth-per-running", str(GROWTH), "--ttft-s", str(TTFT_S),
        "--slowness-sigma", str(args.slowness_sigma), "--step-sigma", str(args.step_sigma),
        "--step-idle-s", str(args.step_idle_s),
        "--preemption-rate", str(args.preemption_rate), "--seed", str(seed),
        *(("--kv-cache-tokens", str(args.kv_cache_tokens)) if args.kv_cache_tokens else ()),
    )  # fmt: skip


async def one_search(url: str, corpus_path: Path, slo: dict[str, float], settings: ReplaySettings) -> dict:
    corpus = load_corpus(corpus_path)
    async with StreamingClient(
        url, model=None, api="completions", max_connections=4100, request_timeout_s=settings.request_timeout_s
    ) as client:
        await client.check()
        replay = Replay(client, corpus, settings, slo)
        t0 = time.perf_counter()
        start, _ = await search_start(replay, settings)
        outcome = await replay.search(start=start, upper=None)
        wall = time.perf_counter() - t0
    # The search's own answer (max passing: the highest pass below the lowest failure) and the
    # knee read from every step (replay.search.pass_fit, at the default pass probability 0.9).
    fitted = pass_fit.fit(replay.steps, settings.knee_pass_probability)
    # Where the strict preemption rule leaves the answer unsure, the report's line says so.
    rare = pass_fit.rare_event_margin(replay.steps, slo, fitted.knee_fit, settings.knee_pass_probability)
    return {
        "answer": outcome.max_passing, "knee_fit": fitted.knee_fit, "steps": list(replay.steps), "wall_s": wall,
        "rare_events": rare,
    }  # fmt: skip


async def fixed_steps(
    url: str, corpus_path: Path, slo: dict[str, float], settings: ReplaySettings, load: int, k: int
) -> list[StepResult]:
    corpus = load_corpus(corpus_path)
    async with StreamingClient(
        url, model=None, api="completions", max_connections=max(load, 1) + 8, request_timeout_s=settings.request_timeout_s
    ) as client:
        await client.check()
        replay = Replay(client, corpus, settings, slo)
        for _ in range(k):
            await replay.step(Concurrency(load))
        return list(replay.steps)


def coverage(steps: list[StepResult], slo: dict[str, float]) -> dict[str, tuple[float, float, int]]:
    """Per client percentile rule: (today's coverage, across-step coverage, steps counted)."""
    out = {}
    for key in slo:
        rule = percentile_rule(key)
        if rule is None:
            continue
        metric, stat = key.split("_")[0], key.split("_")[1]
        rows = [(s, getattr(getattr(s, f"{metric}_ms"), stat)) for s in steps]
        rows = [(s, v) for s, v in rows if v is not None]
        if not rows:
            continue
        pooled = sum(v * s.requests_ok for s, v in rows) / max(1, sum(s.requests_ok for s, _ in rows))

        def holds(ci: list[float | None] | None) -> bool:
            return ci is not None and (ci[0] is None or ci[0] <= pooled) and (ci[1] is None or pooled <= ci[1])

        today = sum(holds((getattr(s, f"{metric}_ms").ci95 or {}).get(stat)) for s, _ in rows)
        across = sum(holds(s.slo_ci95.get(key)) for s, _ in rows)
        out[key] = (today / len(rows), across / len(rows), len(rows))
    return out


def opposite_verdicts(steps: list[StepResult]) -> tuple[int, int, int]:
    """Over loads measured at least twice: (those with both a pass and a fail, those with a pass
    and an inconclusive step but no fail, how many loads)."""
    by_load: dict[int, list[str]] = defaultdict(list)
    for s in steps:
        if s.load.mode == "concurrency" and s.slo_verdict in ("pass", "fail", "inconclusive"):
            by_load[int(s.load.value)].append(s.slo_verdict)
    repeated = {c: v for c, v in by_load.items() if len(v) >= 2}
    both = sum(1 for v in repeated.values() if "pass" in v and "fail" in v)
    undecided = sum(1 for v in repeated.values() if "pass" in v and "inconclusive" in v and "fail" not in v)
    return both, undecided, len(repeated)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=["fake", "url"], default="fake")
    parser.add_argument("--url", help="the server to measure (--target url)")
    parser.add_argument("--corpus", type=Path, help="corpus for --target url (the demo's: prompts/prod.jsonl)")
    parser.add_argument("--slo", help=f"SLOs (default: fake {FAKE_SLO}; url: the CPU demo's)")
    parser.add_argument("--searches", type=int, default=5, help="searches of the point (default 5)")
    parser.add_argument("--steps", type=int, default=10, help="fixed-load steps (default 10)")
    parser.add_argument("--load", type=int, help="the fixed load (default: the searches' median answer)")
    parser.add_argument("--start", type=int, help="each search's first probe (default: the saturation probe)")
    parser.add_argument("--max-requests", type=int, default=400, help="[replay] max_requests (default 400, the demo's)")
    parser.add_argument("--slowness-sigma", type=float, default=0.2, help="fake: per-request lognormal sd")
    parser.add_argument("--step-sigma", type=float, default=0.05, help="fake: per-step shared lognormal sd")
    parser.add_argument(
        "--step-idle-s", type=float, default=0.005,
        help="fake: idle time after which the shared factor is drawn anew (default 0.005 s, under the pause"
        " between two steps: one factor per step; 0.05 keeps it across about half the steps, a level that drifts)",
    )
    parser.add_argument("--preemption-rate", type=float, default=2e-5, help="fake: per request per request running")
    parser.add_argument(
        "--kv-cache-tokens", type=int,
        help="fake: a KV pool of this many tokens; a request that finds it full is preempted, as on vLLM"
        " (default: none, only the spurious preemptions)",
    )
    parser.add_argument(
        "--seed", type=int, default=100,
        help="fake: search i runs with seed SEED + i (default 100); runs with the same seed replay the same draws",
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    if args.target == "url" and (not args.url or not args.corpus):
        parser.error("--target url needs --url and --corpus")
    slo = slo_mod.parse(args.slo or (FAKE_SLO if args.target == "fake" else DEMO_SLO))
    settings = ReplaySettings(
        find_max=True, max_requests=args.max_requests, start_concurrency=args.start, request_timeout_s=300
    )
    searches: list[dict] = []
    fixed: list[StepResult] = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.corpus
        if args.target == "fake":
            corpus = Path(tmp) / "corpus.jsonl"
            corpus.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": TOKENS}) + "\n" for i in range(3000)))

        def server(tag: str, seed: int):
            if args.target == "url":
                return None, args.url
            return start_fake(Path(tmp) / f"fake-{tag}.log", seed, args)

        def run(tag: str, seed: int, coro_of):
            proc, url = server(tag, seed)
            try:
                return asyncio.run(coro_of(url))
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.wait()

        for i in range(args.searches):
            row = run(f"search-{i}", args.seed + i, lambda url: one_search(url, corpus, slo, settings))
            searches.append(row)
            order = [(int(s.load.value), s.slo_verdict) for s in row["steps"]]
            print(f"search {i + 1}: answer {row['answer']} (knee_fit {row['knee_fit']}), {len(row['steps'])} steps, {row['wall_s']:.0f} s: {order}", flush=True)
            for line in row["rare_events"]:
                print(f"  {line}", flush=True)
        answers = [r["answer"] for r in searches if r["answer"] is not None]
        load = args.load or (int(statistics.median(answers)) if answers else None)
        if load is not None and args.steps:
            fixed = run("fixed", args.seed + 899, lambda url: fixed_steps(url, corpus, slo, settings, load, args.steps))
    print()
    for name, values in (("max passing", answers), ("knee_fit", [r["knee_fit"] for r in searches if r["knee_fit"] is not None])):
        if values:
            med = statistics.median(values)
            spread = max(values) - min(values)
            print(f"{name} {values}: spread {spread} ({spread / med:.1%} of the median {med:g})")
    if searches:
        print(f"steps per search: median {statistics.median([len(r['steps']) for r in searches]):g};"
              f" time per search: median {statistics.median([r['wall_s'] for r in searches]):.0f} s")
    if fixed:
        verdicts = [s.slo_verdict for s in fixed]
        print(f"{len(fixed)} steps at {load}: verdicts {dict((v, verdicts.count(v)) for v in sorted(set(map(str, verdicts))))}")
        for key, (today, across, n) in coverage(fixed, slo).items():
            print(f"  {key}: coverage of the pooled estimate over {n} steps: step's own ci95 {today:.0%}, across steps (slo_ci95) {across:.0%}")
    both, undecided, repeated = opposite_verdicts([s for r in searches for s in r["steps"]] + fixed)
    print(f"loads measured at least twice: {repeated}; with both a pass and a fail: {both};"
          f" with a pass and an inconclusive step (no fail): {undecided}")
    if args.json:
        args.json.write_text(json.dumps({
            "answers": [r["answer"] for r in searches],
            "knee_fit": [r["knee_fit"] for r in searches],
            "rare_events": [r["rare_events"] for r in searches],
            "steps_per_search": [len(r["steps"]) for r in searches],
            "wall_s": [r["wall_s"] for r in searches],
            "searches": [[s.model_dump(mode="json") for s in r["steps"]] for r in searches],
            "fixed_load": load,
            "fixed": [s.model_dump(mode="json") for s in fixed],
        }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
