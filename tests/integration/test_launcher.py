"""planner.launcher.VllmServer against tests/fakes/fake_vllm.py (a vLLM-like program with an
"EngineCore" child process in the same group)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from planner.errors import LaunchError, ServerStartFailed
from planner.launcher import VllmServer, group_alive
from planner.ports import free_port, port_is_free
from planner.redaction import redact

REPO = Path(__file__).resolve().parents[2]
FAKE_VLLM = [sys.executable, str(REPO / "tests" / "fakes" / "fake_vllm.py")]
SMALL_KV = ["--kv-cache-memory-bytes", "2M", "--max-model-len", "1024"]


def fake_server(tmp_path: Path, *args: str, env: dict[str, str] | None = None, **kwargs: object) -> VllmServer:
    options: dict[str, object] = {"startup_timeout_s": 30.0, "stop_grace_s": 5.0, **kwargs}
    return VllmServer(
        FAKE_VLLM, model="tiny", args=list(args), env=env or {}, log_path=tmp_path / "server.log", **options  # type: ignore[arg-type]
    )


def group_gone(pgid: int) -> bool:
    # Zombies left to a PID 1 that does not reap them count as gone (see launcher.group_alive).
    return not group_alive(pgid)


def assert_all_gone(server: VllmServer) -> None:
    assert server.pgid is not None
    assert group_gone(server.pgid)
    assert server.port is not None and port_is_free(server.host, server.port)
    assert not server.alive()


@pytest.mark.timeout(60)
def test_start_reads_capacity_and_stop_leaves_nothing(tmp_path: Path) -> None:
    async def run() -> VllmServer:
        async with fake_server(tmp_path, *SMALL_KV) as server:
            assert server.alive()
            async with httpx.AsyncClient(trust_env=False) as client:
                models = (await client.get(f"{server.url}/v1/models")).json()
            assert models["data"][0]["id"] == "tiny"
            assert server.capacity.kv_cache_tokens == 8192
            assert server.capacity.max_concurrency_reported == 8.0
            assert server.capacity.max_model_len == 1024
            assert (server.capacity.num_gpu_blocks, server.capacity.block_size) == (64, 128)
            assert server.capacity.source == "log+metrics"
            assert server.vllm_version == "0.0.0-fake"
            assert server.startup_s is not None and 0 < server.startup_s < 30
            assert server.command_for_record[:2] == FAKE_VLLM
            assert server.command_for_record[2:8] == ["--model", "tiny", "--host", "127.0.0.1", "--port", str(server.port)]
        return server

    server = asyncio.run(run())
    assert_all_gone(server)
    assert server.exit_code == 0  # the fake shut down cleanly on SIGTERM
    assert "Starting vLLM server on http://127.0.0.1:" in server.read_log()


@pytest.mark.timeout(60)
def test_kv_too_small_is_classified_with_the_estimate(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "--kv-cache-memory-bytes", "256K", "--max-model-len", "2048")

    async def run() -> None:
        async with server:
            raise AssertionError("the server should not have started")

    with pytest.raises(ServerStartFailed) as info:
        asyncio.run(run())
    failure = info.value.failure
    assert failure.kind == "kv_too_small"
    assert failure.estimated_max_model_len == 896
    assert failure.exit_code == 1
    assert info.value.log_path == tmp_path / "server.log"
    assert "kv_too_small" in str(info.value) and str(tmp_path / "server.log") in str(info.value)
    assert_all_gone(server)


@pytest.mark.timeout(60)
def test_bad_flag(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "--swap-space", "4")
    with pytest.raises(ServerStartFailed) as info:
        asyncio.run(server.start())
    assert info.value.failure.kind == "bad_flag"
    assert info.value.failure.message == "api_server.py: error: unrecognized arguments: --swap-space 4"
    assert info.value.failure.exit_code == 2
    assert_all_gone(server)


@pytest.mark.timeout(60)
def test_cuda_visible_devices_reaches_the_server(tmp_path: Path) -> None:
    # The fake counts its GPUs from CUDA_VISIBLE_DEVICES, as vLLM sees only those.
    one_gpu = fake_server(tmp_path, *SMALL_KV, "--tensor-parallel-size", "2", cuda_visible_devices="3")
    with pytest.raises(ServerStartFailed) as info:
        asyncio.run(one_gpu.start())
    assert info.value.failure.kind == "world_size_too_large"
    assert "World size (2) is larger than the number of available GPUs (1)" in info.value.failure.message

    async def two() -> None:
        async with fake_server(tmp_path, *SMALL_KV, "--tensor-parallel-size", "2", cuda_visible_devices="3,4") as server:
            assert server.alive()

    asyncio.run(two())


@pytest.mark.timeout(60)
def test_startup_timeout(tmp_path: Path) -> None:
    server = fake_server(tmp_path, *SMALL_KV, env={"FAKE_VLLM_STARTUP_S": "60"}, startup_timeout_s=1.5)
    started = time.perf_counter()
    with pytest.raises(ServerStartFailed) as info:
        asyncio.run(server.start())
    elapsed = time.perf_counter() - started
    failure = info.value.failure
    assert failure.kind == "timeout"
    assert failure.message.startswith("not ready within 1.5 s; last log line:")
    assert failure.exit_code is None
    assert 1.5 <= elapsed < 10
    assert_all_gone(server)


@pytest.mark.timeout(60)
def test_crash_without_a_known_cause(tmp_path: Path) -> None:
    # Any program can be the server command; this one ignores vLLM's flags and dies.
    command = [sys.executable, "-c", "import sys; print('Fatal Python error: Segmentation fault', flush=True); sys.exit(139)"]
    server = VllmServer(command, model="tiny", log_path=tmp_path / "server.log", startup_timeout_s=30)
    with pytest.raises(ServerStartFailed) as info:
        asyncio.run(server.start())
    failure = info.value.failure
    assert failure.kind == "crashed"
    assert failure.exit_code == 139
    assert failure.message == "the server exited with code 139; last error: Fatal Python error: Segmentation fault"
    assert failure.log_tail == ["Fatal Python error: Segmentation fault"]


def test_missing_command_and_busy_port(tmp_path: Path) -> None:
    missing = VllmServer(["no-such-vllm-binary", "serve"], model="m", log_path=tmp_path / "a.log")
    with pytest.raises(LaunchError, match="cannot run the server command 'no-such-vllm-binary'"):
        asyncio.run(missing.start())

    async def busy() -> None:
        listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        try:
            server = fake_server(tmp_path, *SMALL_KV, port=port)
            with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is already in use"):
                await server.start()
        finally:
            listener.close()
            await listener.wait_closed()

    asyncio.run(busy())
    with pytest.raises(LaunchError, match="the server command is empty"):
        VllmServer([], model="m", log_path=tmp_path / "b.log")


@pytest.mark.timeout(60)
def test_a_server_dying_on_its_own_is_noticed(tmp_path: Path) -> None:
    async def run() -> VllmServer:
        async with fake_server(tmp_path, *SMALL_KV, env={"FAKE_VLLM_DIE_AFTER_S": "0.5", "FAKE_VLLM_DIE_EXIT_CODE": "7"}) as server:
            code = await asyncio.wait_for(server.wait_exit(), 20)
            assert code == 7
            assert not server.alive()
            assert server.exit_code == 7
        return server

    server = asyncio.run(run())
    assert_all_gone(server)  # the EngineCore child was stopped too


@pytest.mark.timeout(60)
def test_a_server_dying_after_n_requests(tmp_path: Path) -> None:
    async def run() -> None:
        async with fake_server(tmp_path, *SMALL_KV, env={"FAKE_VLLM_DIE_AFTER_REQUESTS": "2"}) as server:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=10) as client:
                body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
                assert (await client.post("/v1/completions", json=body)).status_code == 200
                await asyncio.sleep(0.3)
                assert server.alive()
                with contextlib.suppress(httpx.HTTPError):
                    await client.post("/v1/completions", json=body)
            assert await asyncio.wait_for(server.wait_exit(), 20) == 1

    asyncio.run(run())


@pytest.mark.timeout(60)
def test_cancelling_start_leaves_no_process_and_frees_the_port(tmp_path: Path) -> None:
    server = fake_server(tmp_path, *SMALL_KV, env={"FAKE_VLLM_STARTUP_S": "60"})

    async def run() -> None:
        task = asyncio.ensure_future(server.start())
        deadline = time.perf_counter() + 20
        while "Using max model len" not in server.read_log() and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        assert server.alive()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert_all_gone(server)


@pytest.mark.timeout(60)
def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path: Path) -> None:
    async def run() -> tuple[VllmServer, float]:
        server = fake_server(tmp_path, *SMALL_KV, env={"FAKE_VLLM_IGNORE_SIGTERM": "1"}, stop_grace_s=1.0)
        async with server:
            started = time.perf_counter()
            await server.stop()
            stop_s = time.perf_counter() - started
            await server.stop()  # idempotent
        return server, stop_s

    server, stop_s = asyncio.run(run())
    assert 1.0 <= stop_s < 8
    assert server.exit_code == -signal.SIGKILL
    assert_all_gone(server)


@pytest.mark.timeout(60)
def test_secrets_are_redacted_and_never_logged(tmp_path: Path) -> None:
    async def run() -> VllmServer:
        server = fake_server(tmp_path, *SMALL_KV, "--api-key", "sekrit-on-argv")
        async with server:
            assert "sekrit-on-argv" not in " ".join(server.command_for_record)
            assert "sekrit-on-argv" not in " ".join(server.command)
            async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
                assert (await client.get("/v1/models")).status_code == 401
                ok = await client.get("/v1/models", headers={"Authorization": "Bearer sekrit-on-argv"})
                assert ok.status_code == 200
        return server

    server = asyncio.run(run())
    assert "sekrit-on-argv" not in server.read_log()

    async def explicit() -> VllmServer:
        async with fake_server(tmp_path, *SMALL_KV, api_key="sekrit-explicit") as other:
            assert other.capacity.source == "log+metrics"
        return other

    other = asyncio.run(explicit())
    assert "sekrit-explicit" not in other.read_log()
    assert "sekrit-explicit" not in " ".join(other.command_for_record)


def test_redact() -> None:
    command = ["docker", "run", "-e", "HF_TOKEN=hf_abc", "-e", "VLLM_API_KEY=k1", "img", "--api-key", "k2", "--api-key=k3", "x-k1-y"]
    assert redact(command, ["k1"]) == [
        "docker", "run", "-e", "HF_TOKEN=***", "-e", "VLLM_API_KEY=***", "img", "--api-key", "***", "--api-key=***", "x-***-y",
    ]


@pytest.mark.timeout(60)
def test_a_killed_planner_does_not_leak_its_servers(tmp_path: Path) -> None:
    # A planner process that starts a server and then is SIGKILLed: no atexit, no finally runs.
    planner = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from planner.launcher import VllmServer

        async def main():
            server = VllmServer({FAKE_VLLM!r}, model="tiny", args={SMALL_KV!r},
                                log_path=Path({str(tmp_path / "server.log")!r}), stop_grace_s=2.0)
            await server.start()
            print(server.pgid, server.port, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", planner], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        pgid, port = (int(x) for x in line.split())
        assert not group_gone(pgid)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.perf_counter() + 15
        while not group_gone(pgid) and time.perf_counter() < deadline:
            time.sleep(0.1)
        assert group_gone(pgid)
        assert port_is_free("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_free_port_is_free() -> None:
    port = free_port()
    assert port_is_free("127.0.0.1", port)


def test_group_alive_ignores_zombies() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert group_alive(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.perf_counter() + 10
        while group_alive(proc.pid) and time.perf_counter() < deadline:
            time.sleep(0.02)
        # Not reaped yet: the kernel still accepts signals for it, but nothing of the group runs.
        os.killpg(proc.pid, 0)
        assert not group_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
    assert not group_alive(proc.pid)
