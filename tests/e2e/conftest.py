"""Fixtures for the e2e tier: real vLLM (the CPU build) serving the tiny random-weight Llama.

Each vLLM start costs 30-90 s on two cores, so tests that only read from a server share one
(`shared_server`, one per session). Its event loop runs in a thread of its own for the
session's lifetime: the launcher is an async context manager tied to the loop that started it,
while each test runs `asyncio.run(...)` in a fresh loop of its own. See support.py for how vLLM
and the model are found (nothing skips: missing vLLM fails).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from planner.launcher import VllmServer
from tests.e2e.support import (
    STARTUP_TIMEOUT_S,
    LoopThread,
    TinyModel,
    assert_server_gone,
    ensure_tiny_model,
    find_vllm_command,
    server_args,
)


@pytest.fixture(autouse=True)
def interference_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the planner against real vLLM, often on a machine that runs other tests
    beside them: what else runs is recorded but does not make a step disturbed
    (replay.step.environment, docs/concepts/environment.md)."""
    monkeypatch.setenv("PLANNER_REPLAY__ALLOW_INTERFERENCE", "true")


@pytest.fixture(scope="session", autouse=True)
def _no_cpu_kv_space_from_the_shell() -> Iterator[None]:
    # Measured on vLLM 0.32: VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes (with both,
    # a 1 GiB pool instead of 2 MiB), so a value left in the user's shell would change every
    # capacity these tests compute by hand.
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
        yield


@pytest.fixture(scope="session")
def vllm_command() -> list[str]:
    return find_vllm_command()


@pytest.fixture(scope="session")
def tiny_model() -> TinyModel:
    return ensure_tiny_model()


@pytest.fixture(scope="session")
def shared_server(
    vllm_command: list[str], tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """One running server for the session: 2 MiB of KV (8,192 tokens), max_model_len 2048, eager mode.

    Tests must only read from it (requests, /metrics); its teardown checks that the whole process
    group is gone and the port is free.
    """
    server = VllmServer(
        vllm_command,
        model=str(tiny_model.path),
        log_path=tmp_path_factory.mktemp("shared-server") / "server.log",
        args=server_args(),
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )
    loop = LoopThread()
    try:
        loop.run(server.start(), STARTUP_TIMEOUT_S + 60)
        yield server
    finally:
        try:
            loop.run(server.stop(), 120)
        finally:
            loop.close()
    assert_server_gone(server)
