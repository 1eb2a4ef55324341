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


def write_ray_sweep_config(
    tmp_path: Path, *, tp: list[int], kv_bytes: list[str], executor: str = "ray", address: str = "auto",
    max_retries: int = 1, nnodes: list[int] | None = None, env: dict[str, str] | None = None,
    startup_timeout_s: float = 30,
) -> Path:
    """A sweep of the fake vLLM over tp x kv_bytes (x nnodes) whose TPOT SLO of 52 ms passes at
    concurrency 2 and fails at 3 (ITL 15 ms x (1 + C)); its model name is unique, so the processes of
    this sweep can be told apart."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    env = {"FAKE_VLLM_ITL_S": "0.015", "FAKE_VLLM_ITL_GROWTH": "1.0", "FAKE_VLLM_TTFT_S": "0.005", **(env or {})}
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f"""
prompts = "{corpus}"

[server]
command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_VLLM))}]
model = "{tmp_path.name}-{uuid.uuid4().hex[:8]}"
args = ["--enforce-eager"]
env = {{ {", ".join(f'{k} = "{v}"' for k, v in env.items())} }}
startup_timeout_s = {startup_timeout_s:g}
stop_grace_s = 5

[grid]
max_model_len = [2048]
tensor_parallel_size = {json.dumps(tp)}
[grid.extra]
kv_cache_memory_bytes = {json.dumps(kv_bytes)}
{f"nnodes = {json.dumps(nnodes)}" if nnodes else ""}

[replay]
start_concurrency = 2
min_requests = 20
max_window_s = 60
request_timeout_s = 30

[slo]
tpot_p50_ms = 52
error_rate = 0
headroom = 0.5

[gpus]
devices = "none"

[executor]
kind = "{executor}"
address = "{address}"
max_retries = {max_retries}
"""
    )
    return cfg
