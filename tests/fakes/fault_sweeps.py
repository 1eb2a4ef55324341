"""What the fault tests and benchmarks/soak.py share: a quick sweep of the fake vLLM, and the process table."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.fakes.sweep_files import FAKE_VLLM, write_corpus


def write_fault_config(
    tmp_path: Path,
    *,
    kv_bytes: list[str],
    env: dict[str, str] | None = None,
    grid_env: str = "",
    replay: str = "",
    slo: str = "tpot_p50_ms = 37\nerror_rate = 0",
    startup_timeout_s: float = 30,
    request_timeout_s: float = 20,
) -> Path:
    """A sweep of the fake vLLM whose ITL is 10 ms x (1 + 0.5 C): a TPOT SLO of 37 ms passes at
    concurrency 5 and fails at 6. Its model name is unique, so this sweep's processes can be told
    apart from others'."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    env = {"FAKE_VLLM_ITL_S": "0.01", "FAKE_VLLM_ITL_GROWTH": "0.5", "FAKE_VLLM_TTFT_S": "0.005", **(env or {})}
    env_toml = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f"""
prompts = "{corpus}"

[server]
command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_VLLM))}]
model = "{tmp_path.name}-{uuid.uuid4().hex[:8]}"
args = ["--enforce-eager"]
env = {{ {env_toml} }}
startup_timeout_s = {startup_timeout_s:g}
stop_grace_s = 3

[grid]
max_model_len = [2048]
[grid.extra]
kv_cache_memory_bytes = {json.dumps(kv_bytes)}
{grid_env}

[replay]
start_concurrency = 4
min_requests = 20
max_window_s = 30
request_timeout_s = {request_timeout_s:g}
{replay}

[slo]
{slo}
headroom = 0.2

[gpus]
devices = "none"

[sweep]
# Every point searched: the faults are each point's, and "adaptive" would skip dominated ones.
strategy = "exhaustive"
"""
    )
    return cfg


def model_of(cfg: Path) -> str:
    return tomllib.loads(cfg.read_text())["server"]["model"]


def fake_vllm_processes(cfg: Path) -> list[str]:
    """This sweep's fake vLLM processes still in the process table (zombies excepted: nothing runs)."""
    model = model_of(cfg)
    out = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True)
    return [
        line.strip()
        for line in out.stdout.splitlines()
        if "fake_vllm.py" in line and model in line and not line.split()[1].startswith("Z")
    ]


def wait_until_gone(find: Callable[[], list], timeout_s: float) -> list:
    """What `find` still finds after up to timeout_s (an empty list as soon as it finds nothing)."""
    deadline = time.monotonic() + timeout_s
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
