"""The files a sweep of the fake vLLM (tests/fakes/fake_vllm.py) reads: a corpus, and a sweep.toml
for the Ray executor's tests and benchmarks/ray_sweep.py."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE_VLLM = ROOT / "tests" / "fakes" / "fake_vllm.py"


def write_corpus(path: Path, n: int = 60) -> Path:
    # ~25 fake tokens of prompt + 6 of output: one 128-token block per request.
    lines = [json.dumps({"id": f"q{i}", "prompt": f"question {i}: " + "how many GPUs " * 6, "max_tokens": 6}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def toml_value(value: object) -> str:
    """A TOML value for the simple ones a sweep.toml here holds: strings, numbers, booleans, lists
    of them (their JSON spelling is valid TOML), and a table of strings (an inline table)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {json.dumps(str(v))}" for k, v in value.items()) + " }"
    return json.dumps(value)


def toml_table(name: str, values: dict[str, object]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())


def write_sweep_config(
    folder: Path, *, corpus: Path, env: dict[str, str], grid: dict[str, list], extra: dict[str, list],
    slo: dict[str, object], replay: dict[str, object] | None = None, more: dict[str, dict[str, object]] | None = None,
    model: str | None = None, startup_timeout_s: float = 30, args: list[str] | None = None,
) -> Path:
    """folder/sweep.toml: a sweep of the fake vLLM (tests/fakes/fake_vllm.py) over `grid` x `extra`
    ([grid] and [grid.extra]), its latency model set by `env` (FAKE_VLLM_*), and the [replay],
    [slo] and `more` tables (e.g. {"grid.env": ..., "executor": ...}). The model name is unique
    unless given, so the processes of one sweep can be told apart from another's; `args` are the
    server's fixed flags (--enforce-eager unless given)."""
    folder.mkdir(parents=True, exist_ok=True)
    server = {
        "command": [sys.executable, str(FAKE_VLLM)],
        "model": model or f"{folder.name}-{uuid.uuid4().hex[:8]}",
        "args": args if args is not None else ["--enforce-eager"],
        "env": env,
        "startup_timeout_s": startup_timeout_s,
        "stop_grace_s": 5,
    }
    # Every point searched, unless a test asks for a strategy: these sweeps test what happens to each
    # point (faults, resume, placement), which the default "adaptive" strategy would skip as dominated.
    more = dict(more or {})
    more["sweep"] = {"strategy": "exhaustive", **more.get("sweep", {})}
    tables = {"server": server, "grid": grid, "grid.extra": extra, "replay": replay or {}, "slo": slo, "gpus": {"devices": "none"}}
    text = f"prompts = {toml_value(str(corpus))}\n\n" + "\n".join(
        toml_table(name, values) for name, values in {**tables, **more}.items() if values
    )
    cfg = folder / "sweep.toml"
    cfg.write_text(text)
    return cfg


def write_ray_sweep_config(
    tmp_path: Path, *, tp: list[int], kv_bytes: list[str], executor: str = "ray", address: str = "auto",
    max_retries: int = 1, nnodes: list[int] | None = None, env: dict[str, str] | None = None,
    startup_timeout_s: float = 30,
) -> Path:
    """A sweep of the fake vLLM over tp x kv_bytes (x nnodes) whose TPOT SLO of 52 ms passes at
    concurrency 2 and fails at 3 (ITL 15 ms x (1 + C))."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    extra: dict[str, list] = {"kv_cache_memory_bytes": kv_bytes}
    if nnodes:
        extra["nnodes"] = nnodes
    return write_sweep_config(
        tmp_path,
        corpus=write_corpus(tmp_path / "corpus.jsonl"),
        env={"FAKE_VLLM_ITL_S": "0.015", "FAKE_VLLM_ITL_GROWTH": "1.0", "FAKE_VLLM_TTFT_S": "0.005", **(env or {})},
        grid={"max_model_len": [2048], "tensor_parallel_size": tp},
        extra=extra,
        replay={"start_concurrency": 2, "min_requests": 20, "max_window_s": 60, "request_timeout_s": 30},
        slo={"tpot_p50_ms": 52, "error_rate": 0, "headroom": 0.5},
        more={"executor": {"kind": executor, "address": address, "max_retries": max_retries}},
        startup_timeout_s=startup_timeout_s,
    )
