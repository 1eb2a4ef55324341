"""Starting one vLLM server, knowing when it is ready or why it is not, and stopping all of it.

    async with VllmServer(["vllm", "serve"], model="m", log_path=Path("point-1/server.log")) as server:
        server.url, server.capacity, server.vllm_version   # ready: /health answered 200
        await server.wait_exit()                           # completes if the server dies

The server command is any list: `vllm serve`, `python -m vllm.entrypoints.openai.api_server`, or a
container (`docker run --rm --init ... IMAGE`; docker forwards SIGTERM to the container, but a
SIGKILLed `docker run` leaves it running, hence `--rm` and a generous stop_grace_s there).
The server runs in its own process group (vLLM spawns an EngineCore process and, with tensor
parallelism, one worker per GPU), with stdout and stderr written straight to the log file, so
no pipe can fill up and block it. Start-up waits on /health and on the process exiting at the
same time, up to `startup_timeout_s`; a server that does not become ready is stopped and
`ServerStartFailed` carries the failure classified from its log.

Stopping sends SIGTERM to the whole group and SIGKILL after `stop_grace_s`. It runs on leaving
the `async with` block however that happens (an exception, a cancelled task, Ctrl-C). So that
no server outlives a planner that is itself killed (SIGKILL, SIGTERM, a crash), each server has a
small reaper process holding the read end of a pipe that only the planner can write: when the
planner goes away the pipe reaches end-of-file and the reaper stops the group. A planner that
stops the server itself tells the reaper first, so a reused process-group id is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from planner.capacity import Capacity
from planner.errors import LaunchError, ServerStartFailed
from planner.estimate.hub import vllm_model_flags
from planner.ports import free_port, port_is_free
from planner.redaction import redact
from planner.vllm_args import flag_int, has_flag, take_api_key
from planner.vllm_log import cache_config_labels, classify_failure, merge_cache_config, parse_capacity, parse_version

HEALTH_INTERVAL_S = 0.5
_HTTP_TIMEOUT_S = 5.0
# Waiting for a SIGKILLed group (or the reaper) to go away; signals are not refused, so this is
# only the time the kernel takes to tear the processes down.
_KILL_WAIT_S = 5.0

# Runs in its own session, so a Ctrl-C at the terminal does not reach it. argv: pgid, grace_s.
_REAPER_CODE = """
import os, signal, sys, time
pgid, grace_s = int(sys.argv[1]), float(sys.argv[2])
if sys.stdin.buffer.read():
    sys.exit(0)
try:
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        os.killpg(pgid, 0)
    os.killpg(pgid, signal.SIGKILL)
except ProcessLookupError:
    pass
"""

def group_processes(pgid: int, proc: Path = Path("/proc")) -> list[tuple[int, str, str]] | None:
    """(pid, state, name) of every process of group `pgid`, zombies included; None where there
    is no /proc to read (macOS)."""
    if not proc.is_dir():
        return None
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after it.
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            out.append((int(entry.name), fields[0], name))
    return out


def group_members(pgid: int) -> list[str] | None:
    """The processes of group `pgid` still running, as "pid state name", zombies left out; None
    where there is no /proc to read (macOS).

    A zombie holds no memory, no port and no CPU: it only waits for its parent to read its exit
    status. vLLM's EngineCore and workers are re-parented to PID 1 when the API server exits, and
    some container inits reap such orphans late (or never), so a zombie may linger after a stop."""
    processes = group_processes(pgid)
    if processes is None:
        return None
    return [f"{pid} {state} {name}" for pid, state, name in processes if state not in ("Z", "X")]


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. Zombies do not count: in a container whose
    PID 1 does not reap orphans, a killed EngineCore stays a zombie of the group for ever."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    members = group_members(pgid)
    return True if members is None else bool(members)


def _connect_host(host: str) -> str:
    # A server listening on every interface is reached through loopback.
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


class VllmServer:
    def __init__(
        self,
        command: Sequence[str],
        *,
        model: str,
        log_path: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        api_key: str | None = None,
        startup_timeout_s: float = 900.0,
        stop_grace_s: float = 20.0,
        cuda_visible_devices: str | None = None,
        cpus: Sequence[int] | None = None,
        headless: bool = False,
    ) -> None:
        if not command:
            raise LaunchError("the server command is empty; give e.g. ['vllm', 'serve']")
        self._args, key_in_args = take_api_key(args)
        self.api_key = api_key if api_key is not None else key_in_args
        self._command = list(command)
        self.model = model
        self.host = host
        self.port = port
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self._env = dict(env or {})
        self.cuda_visible_devices = cuda_visible_devices
        # The CPUs the server's processes run on (planner.cpus); None: wherever the OS puts them.
        self.cpus = tuple(cpus) if cpus else None
        # A rank of a point across nodes other than rank 0 (`vllm serve --headless`) serves no API:
        # it is up once its process runs, and says what went wrong only in its log and exit code.
        self.headless = headless

        self.capacity = Capacity()
        self.vllm_version: str | None = None
        # Seconds from spawning the process to /health answering 200.
        self.startup_s: float | None = None
        self.metrics_note: str | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reaper: asyncio.subprocess.Process | None = None
        self._reaper_fd: int | None = None
        self._log_file: IO[bytes] | None = None
        self._stop_task: asyncio.Task[None] | None = None

    # -- what the sweep reads ---------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise LaunchError("the server has no port before start()")
        host = _connect_host(self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def command(self) -> list[str]:
        """The command line as run (the API key travels in VLLM_API_KEY, never here)."""
        port = str(self.port) if self.port is not None else "<free port>"
        return [*self._command, *vllm_model_flags(self.model), "--host", self.host, "--port", port, *self._args]

    @property
    def command_for_record(self) -> list[str]:
        return redact(self.command, [self.api_key] if self.api_key else [])

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        # start_new_session makes the server the leader of its own group.
        return self.pid

    @property
    def exit_code(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def wait_exit(self) -> int:
        """Completes with the exit code once the server process has exited (for whatever reason)."""
        if self._proc is None:
            raise LaunchError("wait_exit() before start()")
        return await self._proc.wait()

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    # -- starting ---------------------------------------------------------------------------

    async def __aenter__(self) -> VllmServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _child_env(self) -> dict[str, str]:
        env = {**os.environ, **self._env}
        # Without this, a server writing to a file buffers its log and a killed one loses the end.
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
            # CUDA numbers GPUs fastest-first by default; nvidia-smi (planner.gpus) by PCI bus.
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        if self.api_key is not None:
            env["VLLM_API_KEY"] = self.api_key
        if "VLLM_CPU_KVCACHE_SPACE" not in self._env and has_flag(self._args, "--kv-cache-memory-bytes"):
            # vLLM's CPU build lets this variable win over the flag: one left in the user's shell
            # would silently give every point the same pool.
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        return env

    async def start(self) -> VllmServer:
        if self._proc is not None:
            raise LaunchError("this VllmServer was already started; make a new one per server")
        if self.port is None:
            self.port = free_port(_connect_host(self.host))
        elif not port_is_free(self.host, self.port):
            raise LaunchError(
                f"port {self.port} on {self.host} is already in use; choose another or leave the port unset"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        spawned_at = time.perf_counter()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=asyncio.subprocess.STDOUT,
                env=self._child_env(),
                start_new_session=True,
            )
        except OSError as exc:
            self._log_file.close()
            raise LaunchError(
                f"cannot run the server command {self._command[0]!r}: {exc.strerror or exc}; "
                "check the command (e.g. 'vllm serve', or 'python -m vllm.entrypoints.openai.api_server') and PATH"
            ) from exc
        if self.cpus is not None:
            # At once, while the interpreter is still starting: every thread and process the server
            # starts later inherits the mask. (A planner pinned to its own CPUs spawned it there.)
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(self._proc.pid, self.cpus)
        try:
            await self._start_reaper()
            if not self.headless:
                async with self._client() as client:
                    await self._wait_ready(client)
                    self.startup_s = time.perf_counter() - spawned_at
                    await self._read_capacity(client)
        except BaseException:
            await self.stop()
            raise
        return self

    def _client(self) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # trust_env=False: a proxy from the environment must never carry loopback traffic.
        return httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=httpx.Timeout(_HTTP_TIMEOUT_S), trust_env=False
        )

    async def _start_reaper(self) -> None:
        assert self._proc is not None
        read_fd, write_fd = os.pipe()
        try:
            self._reaper = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-c",
                _REAPER_CODE,
                str(self._proc.pid),
                str(self.stop_grace_s),
                stdin=read_fd,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(write_fd)
            raise LaunchError(f"cannot start the reaper process with {sys.executable!r}: {exc}") from exc
        finally:
            os.close(read_fd)
        self._reaper_fd = write_fd

    async def _poll_health(self, client: httpx.AsyncClient) -> None:
        # Bounded by the start-up timeout in _wait_ready; the port refuses connections until ready.
        while True:
            try:
                response = await client.get("/health")
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(HEALTH_INTERVAL_S)

    async def _wait_ready(self, client: httpx.AsyncClient) -> None:
        assert self._proc is not None
        exited = asyncio.ensure_future(self._proc.wait())
        healthy = asyncio.ensure_future(self._poll_health(client))
        try:
            await asyncio.wait({exited, healthy}, timeout=self.startup_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (exited, healthy):
                task.cancel()
            await asyncio.gather(exited, healthy, return_exceptions=True)
        if self._proc.returncode is None and healthy.done() and not healthy.cancelled():
            if healthy.exception() is None:
                return
        timed_out = self._proc.returncode is None
        exit_code = self._proc.returncode
        # Stop first: the group's other processes may still be writing the root cause to the log.
        await self.stop()
        failure = classify_failure(
            self.read_log(), exit_code=exit_code, timed_out=timed_out, startup_timeout_s=self.startup_timeout_s
        )
        raise ServerStartFailed(failure, self.log_path)

    async def _read_capacity(self, client: httpx.AsyncClient) -> None:
        log_text = self.read_log()
        capacity = parse_capacity(log_text, block_size=flag_int(self._args, "--block-size"))
        labels: dict[str, str] | None = None
        try:
            response = await client.get("/metrics")
            if response.status_code == 200:
                labels = cache_config_labels(response.text)
                if labels is None:
                    self.metrics_note = "no vllm:cache_config_info at /metrics"
            else:
                self.metrics_note = f"/metrics answered HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            self.metrics_note = f"/metrics failed: {exc!r}"
        except ValueError as exc:
            self.metrics_note = f"/metrics is not Prometheus text: {exc}"
        self.capacity = merge_cache_config(capacity, labels)

        self.vllm_version = parse_version(log_text)
        try:
            response = await client.get("/version")
            if response.status_code == 200:
                body: Any = response.json()
                if isinstance(body, dict) and isinstance(body.get("version"), str):
                    self.vllm_version = body["version"]
        except (httpx.HTTPError, ValueError):
            pass

    # -- stopping ---------------------------------------------------------------------------

    def _group_alive(self) -> bool:
        return self.pgid is not None and group_alive(self.pgid)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.pgid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    async def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after stop_grace_s. Idempotent; safe to call concurrently."""
        if self._proc is None:
            return
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop())
        try:
            await asyncio.shield(self._stop_task)
        except asyncio.CancelledError:
            # Cancelled again while stopping (a second Ctrl-C): the group must not outlive us.
            self._kill_now()
            raise

    async def _wait_group_gone(self, timeout_s: float) -> bool:
        deadline = time.perf_counter() + timeout_s
        while self._group_alive():
            if time.perf_counter() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def _stop(self) -> None:
        assert self._proc is not None
        if self._group_alive():
            self._signal_group(signal.SIGTERM)
            deadline = time.perf_counter() + self.stop_grace_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), self.stop_grace_s)
            # The API server may be gone while its EngineCore and workers are still shutting down.
            if not await self._wait_group_gone(max(0.0, deadline - time.perf_counter())):
                self._signal_group(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._proc.wait(), _KILL_WAIT_S)
        await self._wait_group_gone(_KILL_WAIT_S)
        await self._release_reaper()
        if self._log_file is not None:
            self._log_file.close()

    def _kill_now(self) -> None:
        self._signal_group(signal.SIGKILL)
        self._dismiss_reaper()
        if self._log_file is not None:
            self._log_file.close()

    def _dismiss_reaper(self) -> None:
        # Telling the reaper before closing the pipe: a bare end-of-file would make it signal the
        # group id, which the kernel may have handed to an unrelated group by the time we exit.
        if self._reaper_fd is None:
            return
        fd, self._reaper_fd = self._reaper_fd, None
        with contextlib.suppress(OSError):
            os.write(fd, b"stopped")
        os.close(fd)

    async def _release_reaper(self) -> None:
        self._dismiss_reaper()
        if self._reaper is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reaper.wait(), _KILL_WAIT_S)
