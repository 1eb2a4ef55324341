"""The launcher against real vLLM (CPU build) serving the tiny model.

The capacity the launcher reports must agree three ways: vLLM's log line, the
`kv_cache_size_tokens` label of `vllm:cache_config_info`, and a figure computed here by hand from
the model's config.json and the KV bytes given to the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path

import httpx
import pytest

from planner.errors import ServerStartFailed
from planner.launcher import VllmServer
from planner.vllm_log import cache_config_labels
from tests.e2e.support import (
    CPU_BLOCK_SIZE,
    SHARED_KV_BYTES,
    SHARED_MAX_MODEL_LEN,
    STARTUP_TIMEOUT_S,
    TinyModel,
    assert_server_gone,
    group_alive,
    server_args,
)

pytestmark = pytest.mark.e2e


def _metrics_labels(url: str) -> dict[str, str]:
    response = httpx.get(f"{url}/metrics", timeout=10, trust_env=False)
    response.raise_for_status()
    labels = cache_config_labels(response.text)
    assert labels is not None, "vllm:cache_config_info is missing from /metrics"
    return labels


@pytest.mark.timeout(600)
def test_reported_capacity_matches_log_metrics_and_hand_computation(shared_server, tiny_model: TinyModel) -> None:
    # By hand: every layer keeps its own K and V for each token, in blocks of 128 on the CPU.
    # 2 MiB / (2 layers x 128 tokens x 128 bytes) = 64 blocks. vLLM 0.32 reports capacity over
    # ALL the blocks, the reserved null block included (measured: 8,192 tokens and 4.00x for 64
    # blocks at max_model_len 2048, not 63 x 128 and 3.94x); only the "estimated maximum model
    # length" of the kv_too_small error leaves the null block out (see the next test).
    blocks = tiny_model.kv_blocks(SHARED_KV_BYTES)
    expected_tokens = blocks * CPU_BLOCK_SIZE
    expected_concurrency = blocks / math.ceil(SHARED_MAX_MODEL_LEN / CPU_BLOCK_SIZE)
    assert (blocks, expected_tokens) == (64, 8192), "the tiny model's shape changed; revisit the figures here"

    capacity = shared_server.capacity
    labels = _metrics_labels(shared_server.url)
    assert capacity.kv_cache_tokens == expected_tokens
    assert int(labels["kv_cache_size_tokens"]) == expected_tokens
    assert int(labels["num_gpu_blocks"]) == blocks
    assert int(labels["block_size"]) == CPU_BLOCK_SIZE
    assert int(labels["kv_cache_memory_bytes"]) == SHARED_KV_BYTES
    assert capacity.source == "log+metrics"
    assert capacity.max_model_len == SHARED_MAX_MODEL_LEN
    assert capacity.max_concurrency_reported == pytest.approx(expected_concurrency)
    assert capacity.block_size == CPU_BLOCK_SIZE
    assert capacity.num_gpu_blocks == blocks
    assert shared_server.vllm_version is not None and shared_server.vllm_version[0].isdigit()
    assert shared_server.startup_s is not None and 0 < shared_server.startup_s < STARTUP_TIMEOUT_S


@pytest.mark.timeout(600)
def test_tiny_model_serves_completions_and_chat(shared_server, tiny_model: TinyModel) -> None:
    async def run() -> tuple[dict, dict, list[str]]:
        async with httpx.AsyncClient(base_url=shared_server.url, timeout=60, trust_env=False) as client:
            models = (await client.get("/v1/models")).json()
            completion = await client.post(
                "/v1/completions",
                json={"model": str(tiny_model.path), "prompt": "The capacity planner", "max_tokens": 16, "ignore_eos": True},
            )
            completion.raise_for_status()
            # The chat template must render, or vLLM answers 400 for every chat request.
            chunks: list[str] = []
            async with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": str(tiny_model.path),
                    "messages": [{"role": "user", "content": "Say hello."}],
                    "max_tokens": 12,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ) as stream:
                assert stream.status_code == 200, await stream.aread()
                chunks = [line async for line in stream.aiter_lines() if line.startswith("data: ")]
            return models, completion.json(), chunks

    models, completion, chunks = asyncio.run(run())
    assert [m["max_model_len"] for m in models["data"]] == [SHARED_MAX_MODEL_LEN]
    assert completion["usage"]["completion_tokens"] == 16
    assert chunks[-1] == "data: [DONE]"
    usage = [c for c in chunks if '"usage":{' in c and '"choices":[]' in c]
    assert len(usage) == 1 and '"completion_tokens":12' in usage[0]


@pytest.mark.timeout(600)
def test_kv_pool_too_small_for_max_model_len_is_classified_with_vllms_estimate(
    vllm_command: list[str], tiny_model: TinyModel, tmp_path: Path
) -> None:
    kv_bytes = 256 * 1024
    max_model_len = 2048
    # 256 KiB / (2 x 128 x 128 bytes) = 8 blocks. The estimate vLLM prints leaves out the reserved
    # null block: (8 - 1) x 128 = 896 tokens, while serving 2048 needs 16 blocks.
    blocks = tiny_model.kv_blocks(kv_bytes)
    expected_estimate = (blocks - 1) * CPU_BLOCK_SIZE
    assert expected_estimate < max_model_len
    server = VllmServer(
        vllm_command,
        model=str(tiny_model.path),
        log_path=tmp_path / "server.log",
        args=server_args(kv_bytes, max_model_len),
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )

    async def run() -> ServerStartFailed:
        with pytest.raises(ServerStartFailed) as caught:
            async with server:
                pass
        return caught.value

    failure = asyncio.run(run()).failure
    assert failure.kind == "kv_too_small", failure.message
    assert failure.estimated_max_model_len == expected_estimate == 896
    assert f"max seq len ({max_model_len})" in failure.message
    assert failure.exit_code not in (None, 0)
    assert failure.log_tail, "the failure keeps the end of the log"
    assert_server_gone(server)


@pytest.mark.timeout(300)
def test_unknown_flag_is_classified_bad_flag(vllm_command: list[str], tiny_model: TinyModel, tmp_path: Path) -> None:
    # --swap-space was removed from vLLM's V1 engine; argparse stops the server at once.
    server = VllmServer(
        vllm_command,
        model=str(tiny_model.path),
        log_path=tmp_path / "server.log",
        args=["--enforce-eager", "--swap-space", "4"],
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )

    async def run() -> ServerStartFailed:
        with pytest.raises(ServerStartFailed) as caught:
            await server.start()
        return caught.value

    failure = asyncio.run(run()).failure
    assert failure.kind == "bad_flag", failure.message
    assert "--swap-space" in failure.message
    assert_server_gone(server)


@pytest.mark.timeout(300)
def test_cancelled_start_up_leaves_no_process_behind(
    vllm_command: list[str], tiny_model: TinyModel, tmp_path: Path
) -> None:
    # Cancelled once vLLM has spawned its EngineCore and worker: those are in the server's
    # process group and must go with it, not linger holding memory.
    log_path = tmp_path / "server.log"
    server = VllmServer(
        vllm_command,
        model=str(tiny_model.path),
        log_path=log_path,
        args=server_args(),
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )

    async def run() -> None:
        task = asyncio.create_task(server.start())
        deadline = time.perf_counter() + 240
        # EngineCore's first log line shows the engine process exists; bounded by the deadline.
        while "EngineCore" not in server.read_log():
            assert not task.done(), f"the server stopped before its engine started:\n{server.read_log()[-2000:]}"
            assert time.perf_counter() < deadline, "no EngineCore line in the log within 240 s"
            await asyncio.sleep(0.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert server.pgid is not None
    assert not group_alive(server.pgid)
    assert_server_gone(server)
