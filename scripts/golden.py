"""Golden results: proof that a refactor of the measuring core changed nothing a user could see.

    python scripts/golden.py record DIR    # run the scenarios, store their results in DIR
    python scripts/golden.py check DIR     # run them again; print every difference, exit 1 on any

Three scenarios run against the fake vLLM of tests/fakes, with fixed seeds and latency models
whose answers sit well clear of their SLO bounds:
- `replay_find_max`: `planner replay --find-max` against the fake OpenAI server (a process);
- `sweep`: `planner sweep` of the fake vLLM program over two points (one whose KV cache is too
  small to start, one that is searched);
- `sessions`: `planner replay` of a session corpus (three-turn conversations with think times).

What is stored is each scenario's results file with everything that depends on the machine's
timing removed: times and timestamps, every figure of a step's window (latencies, throughput,
request counts, the client's lag flags: how many requests finish before a window closes depends
on the scheduler), and the paths, ports and process ids of this run (and the points'
fingerprints, which hash the paths of the server command). Removed values are replaced
by a placeholder, so the files still compare their shape: a field added, dropped or renamed is a
difference. What is
left is what the code decides: the loads and their order, every verdict, the search's answer and
why it stopped, the classification of a failed point, the settings, the identity.

Two runs of the same code compare equal (record twice and check: that is how the list of
removed fields was drawn). The check takes a few minutes; it needs no GPU and no vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# Outside a step: numbers whose key names a time, a duration, a rate or memory measured now.
TIMING_KEY = re.compile(r"(_s|_at|_per_s|_per_gpu|_mib|_ms|_ci95)$")
# Inside a step (a measurement window): what the code decides, kept whole. Every other value
# there is a figure of the window, and timing: kept as its key only (even a flag such as
# client_limited, or a note that is there or not, follows the machine's load).
MEASURED = "<measured>"
STEP_DECISIONS = {
    "load", "slo_pass", "slo_verdict", "slo_verdicts", "slo_violations", "slo_unverified", "slo_views",
    "tokens_source",
}


def placeholder(value: Any) -> str:
    return f"<{type(value).__name__}>"


def normalize(value: Any, key: str = "", *, in_step: bool = False, subs: dict[str, str]) -> Any:
    """The value with its timing-dependent parts replaced by placeholders (see the module's text).
    `in_step`: the value is a figure of a step's window."""
    if isinstance(value, dict):
        return {
            k: normalize(v, k, in_step=in_step and k not in STEP_DECISIONS, subs=subs)
            for k, v in sorted(value.items())
        }
    if in_step and not isinstance(value, dict):
        return MEASURED
    if isinstance(value, list):
        if key == "steps":
            return [normalize(v, in_step=True, subs=subs) for v in value]
        items = [normalize(v, key, subs=subs) for v in value]
        # A server command's port is picked free at each run.
        return [("<port>" if i and items[i - 1] == "--port" else v) for i, v in enumerate(items)]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return placeholder(value) if TIMING_KEY.search(key) else value
    if isinstance(value, str):
        # A point's fingerprint hashes its server command, whose paths are this checkout's and
        # this interpreter's: it differs between two checkouts of the same code.
        if (key.endswith("_at") or key == "fingerprint") and value:
            return placeholder(value)
        for old, new in subs.items():
            value = value.replace(old, new)
        value = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", value)
        # A server log's lines: process ids, clock times and ports change at each run.
        value = re.sub(r"pid=\d+", "pid=<pid>", value)
        value = re.sub(r"\d\d-\d\d \d\d:\d\d:\d\d", "<time>", value)
        return re.sub(r"'port': \d+", "'port': <port>", value)
    return value


# ---------------------------------------------------------------------------------------------
# The scenarios


@contextlib.contextmanager
def fake_server(log: Path, *args: str) -> Iterator[str]:
    """The fake OpenAI server as a process; yields its URL and stops it after."""
    from tests.fakes.openai_server import start_process
    from tests.integration.stopping import terminate_and_wait

    proc, url = start_process(log, "--host", "127.0.0.1", "--port", "0", "--seed", "0", *args, ready_timeout_s=30)
    try:
        yield url
    finally:
        terminate_and_wait(proc, timeout_s=10)


def planner(*argv: str) -> None:
    from planner.cli import main

    code = main(list(argv))
    if code != 0:
        raise RuntimeError(f"planner {' '.join(argv)} exited {code}")


def replay_find_max(work: Path) -> Path:
    # ITL = 20 ms x (1 + 3 x running): TPOT 80 ms at 1, 140 at 2, 200 at 3, 500 at 8; the bound
    # of 170 ms sits 20 % from both sides of the knee (2 passes, 3 fails).
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(
        json.dumps({"prompt": f"request {i}: tell me about KV caches", "max_tokens": 6}) + "\n" for i in range(80)
    ))
    out = work / "out"
    with fake_server(work / "server.log", "--itl-s", "0.02", "--itl-growth-per-running", "3", "--ttft-s", "0.005") as url:
        planner(
            "replay", "--prompts", str(corpus), "--url", url, "--find-max", "--min-requests", "20",
            "--max-concurrency", "8", "--slo", "tpot_p50_ms=170,error_rate=0", "--seed", "0", "--output", str(out),
        )
    return out / "replay.json"


def sweep(work: Path) -> Path:
    from tests.fakes.sweep_files import write_corpus, write_sweep_config

    # ITL at concurrency C is about 40 ms x (1 + 0.5 C): TPOT 120 ms at 4, 140 at 5, 160 at 6;
    # the bound of 150 ms splits 5 and 6. 64 KiB of KV cache holds no request of 2048 tokens.
    cfg = write_sweep_config(
        work,
        corpus=write_corpus(work / "corpus.jsonl", n=60),
        env={"FAKE_VLLM_ITL_S": "0.04", "FAKE_VLLM_ITL_GROWTH": "0.5", "FAKE_VLLM_TTFT_S": "0.005"},
        grid={"max_model_len": [2048]},
        extra={"kv_cache_memory_bytes": ["64K", "4M"]},
        replay={"start_concurrency": 4, "min_requests": 30, "max_window_s": 60, "request_timeout_s": 30},
        slo={"tpot_p50_ms": 150, "error_rate": 0, "max_preemptions": 0, "headroom": 0.2},
        model="golden-fake",
        startup_timeout_s=60,
    )
    out = work / "out"
    planner("sweep", "--config", str(cfg), "--output", str(out))
    return out / "sweep.json"


def sessions(work: Path) -> Path:
    corpus = work / "sessions.jsonl"
    lines = []
    for i in range(8):
        lines.append({
            "id": f"s{i}",
            "system": "You answer briefly.",
            "conversation": [
                {"user": f"first question of session {i}", "max_tokens": 4},
                {"user": "and a follow-up", "max_tokens": 3, "think_time_s": 0.2},
                {"user": "one more", "max_tokens": 2},
            ],
        })
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = work / "out"
    with fake_server(work / "server.log", "--itl-s", "0.002") as url:
        planner(
            "replay", "--prompts", str(corpus), "--url", url, "--api", "chat", "--concurrency", "2",
            "--warmup-requests", "0", "--min-requests", "12", "--max-requests", "12", "--think-time-s", "0.05",
            "--seed", "3", "--slo", "error_rate=0", "--output", str(out),
        )
    return out / "replay.json"


SCENARIOS: dict[str, Callable[[Path], Path]] = {
    "replay_find_max": replay_find_max,
    "sweep": sweep,
    "sessions": sessions,
}


def run_all(raw_folder: Path | None = None) -> dict[str, Any]:
    """Every scenario's normalized results, by name; the results as written go to `raw_folder`."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        for name, scenario in SCENARIOS.items():
            work = Path(tmp) / name
            work.mkdir()
            print(f"golden: {name} ...", file=sys.stderr, flush=True)
            raw = json.loads(scenario(work).read_text())
            if raw_folder is not None:
                raw_folder.mkdir(parents=True, exist_ok=True)
                (raw_folder / f"{name}.json").write_text(dump(raw))
            subs = {sys.executable: "<python>", str(work): "<work>", str(ROOT): "<root>"}
            found[name] = normalize(raw, subs=subs)
    return found


def dump(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True) + "\n"


def record(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    # The results as written, beside the normalized ones: what to read when a check differs.
    for name, value in run_all(folder / "raw").items():
        (folder / f"{name}.json").write_text(dump(value))
    print(f"golden: recorded {len(SCENARIOS)} scenarios in {folder}")
    return 0


def check(folder: Path) -> int:
    missing = [n for n in SCENARIOS if not (folder / f"{n}.json").is_file()]
    if missing:
        print(f"golden: {folder} has no {', '.join(m + '.json' for m in missing)}: run `record` first", file=sys.stderr)
        return 2
    differ = 0
    for name, value in run_all().items():
        before = (folder / f"{name}.json").read_text()
        now = dump(value)
        if before == now:
            print(f"golden: {name}: equal")
            continue
        differ += 1
        print(f"golden: {name}: DIFFERS")
        sys.stdout.writelines(difflib.unified_diff(
            before.splitlines(keepends=True), now.splitlines(keepends=True),
            fromfile=f"{folder / name}.json (recorded)", tofile=f"{name} (now)",
        ))
    print(f"golden: {len(SCENARIOS) - differ} of {len(SCENARIOS)} scenarios equal")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="golden.py", description=__doc__.split("\n\n")[0])
    p.add_argument("verb", choices=["record", "check"])
    p.add_argument("folder", type=Path, metavar="DIR")
    args = p.parse_args(argv)
    return record(args.folder) if args.verb == "record" else check(args.folder)


if __name__ == "__main__":
    raise SystemExit(main())
