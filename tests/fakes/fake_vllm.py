"""A fake vLLM server program for launcher and sweep integration tests.

Run it with the test's interpreter, the way the planner runs `python -m vllm.entrypoints...`:

    [sys.executable, "tests/fakes/fake_vllm.py"] + ["--model", "m", "--host", H, "--port", P, ...]

It takes vLLM's flags and rejects unknown ones the way argparse does (`error: unrecognized
arguments: ...`, exit 2), prints vLLM 0.32's log lines with their `(APIServer pid=N) INFO
MM-DD HH:MM:SS [file.py:N]` prefix, sizes its KV cache like vLLM, fails like vLLM on points
that cannot start, and then serves the OpenAI API with tests/fakes/openai_server.py's FakeServer.
Like vLLM it runs a second process (the "EngineCore") in its own process group, so tests see
whether a launcher stops the whole group.

Pretend model: 2 layers, 4 attention heads, 2 KV heads of 16 dims, bf16, max_position_embeddings
4096. At tp 1 that is the 256 KV bytes per token of the tiny Llama scripts/build-tiny-model.sh
builds (1 KV head of 32 dims); at tp 2 and above the fake's per-rank figure halves, the tiny
Llama's does not. So

    bytes per token   = layers x 2 (K and V) x max(1, kv_heads // tp) x head_dim x 2 bytes = 256 (tp 1)
    num_blocks        = kv_bytes // (block_size x bytes per token)        (block 0 is the null block)
    max concurrency   = num_blocks / ceil(max_model_len / block_size)
    kv_cache_tokens   = int(max concurrency x max_model_len)               (what vLLM prints)

kv_bytes is --kv-cache-memory-bytes, or else --gpu-memory-utilization x FAKE_VLLM_DEVICE_MEMORY
(default 16M) minus FAKE_VLLM_WEIGHTS (default 4M). Start-up fails (traceback, exit 1) with
vLLM's own texts when: kv_bytes holds no block beyond the null block ("No available memory for
the cache blocks"); one request of max_model_len does not fit in num_blocks - 1 blocks ("To serve
at least one request ...", with "the estimated maximum model length is E" for
E = (num_blocks - 1) x block_size when E > 0); tensor x pipeline parallel size is above
FAKE_VLLM_GPUS (default: the number of CUDA_VISIBLE_DEVICES entries, else 1); 4 heads are not
divisible by --tensor-parallel-size; --max-model-len is above 4096 without
VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.

Latency, from FakeServer's capacity model (admission by --max-num-seqs and the KV pool; a full
pool preempts): with R requests running,

    inter-token latency  = FAKE_VLLM_ITL_S  x (1 + FAKE_VLLM_ITL_GROWTH  x R)
    time to first token  = FAKE_VLLM_TTFT_S x (1 + FAKE_VLLM_TTFT_GROWTH x R)   (+ queueing)

(defaults 0.01 s, 0.1, 0.02 s, 0.05). --max-num-batched-tokens B scales the ITL growth by
B / FAKE_VLLM_BATCHED_TOKENS_REF (default 2048): a larger token budget per engine step mixes
longer prefill chunks into decode steps, so each running request slows the others more. It is
the one flag of the fake that changes its speed (the grid's speed classes,
planner.sweep.classes); without it the growth is FAKE_VLLM_ITL_GROWTH as given. So under a closed-loop load of C requests, while C stays
within max-num-seqs and the pool, ITL is about itl_s x (1 + growth x C): an ITL SLO of X s
passes up to C = (X / itl_s - 1) / growth, the known answer a sweep's search must find.

Noise (tests/fakes/openai_server.py's Behavior): FAKE_VLLM_SLOWNESS_SIGMA (a per-request lognormal
factor on every gap), FAKE_VLLM_STEP_SIGMA (a lognormal factor shared by all requests until the
server idles, drawn anew per step), FAKE_VLLM_PREEMPTION_RATE (spurious preemptions per request
per request running); all 0 by default.

Other knobs: FAKE_VLLM_STARTUP_S (seconds before the port opens); FAKE_VLLM_DIE_AFTER_S (after
ready, the server dies with os._exit(FAKE_VLLM_DIE_EXIT_CODE, default 1)); FAKE_VLLM_DIE_AFTER_REQUESTS
(the same once N completion requests have arrived: unlike a time, independent of machine load);
FAKE_VLLM_IGNORE_SIGTERM=1 (both processes ignore SIGTERM, so only SIGKILL stops them);
FAKE_VLLM_STARTS_FILE with FAKE_VLLM_SLOWER_FROM_START = "N:F" (each start adds a line to the file;
from the Nth start on, inter-token latency is F times longer: an answer that depends on one start),
or "N-M:F" (only the Nth to the Mth start are slower: one slow start among normal ones).

Faults that begin once FAKE_VLLM_FAULT_AFTER_REQUESTS (default 0) completion requests have arrived,
named by FAKE_VLLM_FAULT (the fault catalogue's, docs/reference/faults.md):
  stop              the server SIGSTOPs itself (as `kill -STOP`, or a debugger attaching)
  hang              the event loop blocks: the port still accepts connections (the kernel's
                    backlog), nothing answers, /health included (a stuck API server)
  stall             streams stop after their first tokens with the connection left open, and
                    every later stream too; /health answers (a stuck engine)
  metrics_gone      /metrics answers 404
  metrics_garbage   /metrics answers 200 with text that is not Prometheus' format
  oom               the server SIGKILLs itself, as the kernel's OOM killer does, after adding one
                    to `oom_kill N` in the file FAKE_VLLM_OOM_EVENTS names (the cgroup's
                    memory.events, as a test hands it to the planner)

Across nodes (--nnodes N, vLLM's multiprocessing backend): tensor x pipeline parallel size must
divide by N, and each node needs its share of the GPUs. Rank 0 listens on --master-addr:--master-port
and waits (FAKE_VLLM_RENDEZVOUS_S, default 60) for ranks 1..N-1, which run with `--node-rank k
--headless` and connect to it, before it sizes its cache and serves. As measured with vLLM 0.32's
CPU build (two ranks, tp 2): a headless rank outlives rank 0 and stops only on a signal; a rank
that goes away takes rank 0 down (real vLLM at its next request: "Connection closed by peer",
then EngineDeadError; here at once, exit 1). A headless rank dies (exit 1) once the file
FAKE_VLLM_RANK_DIE_WHEN names exists (a test's trigger, independent of machine load). Rank 0 that
cannot listen on the master port exits 1 on torch's DistNetworkError (EADDRINUSE), as vLLM's worker
does; FAKE_VLLM_MASTER_PORT_TAKEN names a file that counts rank 0's starts, and the first N of them
(FAKE_VLLM_MASTER_PORT_TAKEN_STARTS, default 1) find the master port held by another socket (on
one node, the torch.distributed port vLLM picks for its own workers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes.openai_server import FAKE_VERSION, Behavior, FakeServer  # noqa: E402

NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 16
DTYPE_BYTES = 2
DERIVED_MAX_MODEL_LEN = 4096
DEFAULT_BLOCK_SIZE = 128  # the CPU backend's
DEFAULT_MAX_NUM_SEQS = 128
GiB = 1 << 30
# The pretend "EngineCore" quits by itself this long after the fake server is gone, so a test
# that fails to stop the group does not leave it behind for long (tests check far sooner).
ORPHAN_GRACE_S = 30.0
ENGINE_MAX_LIFE_S = 900.0


def human_readable_int(value: str) -> int:
    """vLLM's parser for --kv-cache-memory-bytes: '1k' = 1000, '1K' = 1024, '2M', '1G', ..."""
    value = value.strip()
    if value and value[-1] in "kmgt":
        return int(float(value[:-1]) * 10 ** (3 * ("kmgt".index(value[-1]) + 1)))
    if value and value[-1] in "KMGT":
        return int(value[:-1]) * 2 ** (10 * ("KMGT".index(value[-1]) + 1))
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="api_server.py")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=human_readable_int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    p.add_argument("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128, 256], default=None)
    p.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"], default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    # Multi-node (vLLM's multiprocessing backend): one process per node, rank 0 serves the API.
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"], default=None)
    return p


class Logger:
    """vLLM's log format: `(PROC pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] message`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __call__(self, level: str, where: str, message: str, proc: str = "APIServer") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        print(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {message}", flush=True)

    def traceback(self, proc: str, frames: list[tuple[str, int, str]], error: str) -> None:
        lines = ["Traceback (most recent call last):"]
        for path, line, func in frames:
            lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append(error)
        for line in lines:
            print(f"({proc} pid={self.pid}) {line}", flush=True)


def _config_error(log: Logger, message: str) -> int:
    # vLLM raises config errors in the API server process while building the engine config.
    log.traceback(
        "APIServer",
        [
            ("/opt/vllm/vllm/entrypoints/openai/api_server.py", 74, "<module>"),
            ("/opt/vllm/vllm/engine/arg_utils.py", 1873, "create_engine_config"),
            ("/opt/vllm/vllm/config/model.py", 1549, "verify_with_parallel_config"),
        ],
        f"ValueError: {message}",
    )
    return 1


def _engine_error(log: Logger, engine_log: Logger, message: str) -> int:
    # Engine start-up errors: the root cause in the EngineCore, then the API server's wrapper.
    engine_log("ERROR", "core.py:1510", "EngineCore failed to start.", proc="EngineCore")
    engine_log.traceback(
        "EngineCore",
        [
            ("/opt/vllm/vllm/v1/engine/core.py", 1492, "run_engine_core"),
            ("/opt/vllm/vllm/v1/engine/core.py", 372, "_initialize_kv_caches"),
            ("/opt/vllm/vllm/v1/core/kv_cache_utils.py", 1029, "_check_enough_kv_cache_memory"),
        ],
        f"ValueError: {message}",
    )
    log.traceback(
        "APIServer",
        [
            ("/opt/vllm/vllm/entrypoints/openai/api_server.py", 74, "<module>"),
            ("/opt/vllm/vllm/v1/engine/utils.py", 1432, "wait_for_engine_startup"),
        ],
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
    )
    return 1


def _start_engine_core(ignore_sigterm: bool) -> subprocess.Popen[bytes]:
    code = f"""
import os, signal, time
if {ignore_sigterm!r}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
parent = os.getppid()
started = time.monotonic()
orphaned_at = None
while time.monotonic() - started < {ENGINE_MAX_LIFE_S}:
    if orphaned_at is None and os.getppid() != parent:
        orphaned_at = time.monotonic()
    if orphaned_at is not None and time.monotonic() - orphaned_at > {ORPHAN_GRACE_S}:
        break
    time.sleep(0.2)
"""
    # Same process group as this one (no new session): the group is what the launcher stops.
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)


def _start_factor() -> float:
    """FAKE_VLLM_SLOWER_FROM_START = "N:F": F from the Nth start counted in FAKE_VLLM_STARTS_FILE;
    "N-M:F": F on the Nth to the Mth start only."""
    path, rule = os.environ.get("FAKE_VLLM_STARTS_FILE"), os.environ.get("FAKE_VLLM_SLOWER_FROM_START")
    if not path or not rule:
        return 1.0
    with open(path, "a+") as f:
        f.write("start\n")
        f.seek(0)
        starts = len(f.read().splitlines())
    span, factor = rule.split(":")
    first, _, last = span.partition("-")
    slower = starts >= int(first) and (not last or starts <= int(last))
    return float(factor) if slower else 1.0


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def itl_growth(max_num_batched_tokens: int | None) -> float:
    """FAKE_VLLM_ITL_GROWTH, scaled by --max-num-batched-tokens over FAKE_VLLM_BATCHED_TOKENS_REF."""
    growth = _env_float("FAKE_VLLM_ITL_GROWTH", 0.1)
    if max_num_batched_tokens is None:
        return growth
    return growth * max_num_batched_tokens / _env_float("FAKE_VLLM_BATCHED_TOKENS_REF", 2048)


class FakeVllmServer(FakeServer):
    """FakeServer whose vllm:cache_config_info carries this engine's cache config, as vLLM's does."""

    def __init__(self, behavior: Behavior, *, host: str, port: int, cache_info: dict[str, str]) -> None:
        super().__init__(behavior, host=host, port=port)
        self.cache_info = {**cache_info, "engine": "0"}
        self.garbage_metrics = False

    def metrics_text(self) -> str:
        if self.garbage_metrics:
            return "<html><body>502 Bad Gateway</body></html>\nvllm:num_requests_running{engine=0 not a number\n"
        lines = [line for line in super().metrics_text().splitlines() if "vllm:cache_config_info" not in line]
        labels = ",".join(f'{k}="{v}"' for k, v in self.cache_info.items())
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{{{labels}}} 1.0",
        ]
        return "\n".join(lines) + "\n"


def _headless(args: argparse.Namespace, log: Logger) -> int:
    """Ranks 1..N-1: join rank 0's group, then run until a signal."""
    head = f"{args.master_addr}:{args.master_port}"
    log("INFO", "serve.py:214", f"Launching vLLM (v{FAKE_VERSION}) headless multiproc executor, with head node address {head} for torch.distributed process group.")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadline = time.monotonic() + _env_float("FAKE_VLLM_RENDEZVOUS_S", 60.0)
    while True:
        try:
            conn = socket.create_connection((args.master_addr, args.master_port), timeout=1.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                log("ERROR", "parallel_state.py:1210", f"Timed out joining the torch.distributed group at {head}.")
                return 1
            time.sleep(0.2)
    conn.sendall(f"{args.node_rank}\n".encode())
    engine = _start_engine_core(False)
    try:
        trigger = os.environ.get("FAKE_VLLM_RANK_DIE_WHEN")
        # Whatever rank 0 does, this rank runs on until a signal (or its own death).
        started = time.monotonic()
        while time.monotonic() - started < ENGINE_MAX_LIFE_S:
            if trigger and os.path.exists(trigger):
                log("ERROR", "multiproc_executor.py:540", f"Worker proc VllmWorker-{args.node_rank} died unexpectedly, shutting down executor.")
                os._exit(1)
            time.sleep(0.1)
        return 0
    except SystemExit:
        log("INFO", "multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1")
        raise
    finally:
        conn.close()
        engine.terminate()


def _port_taken_this_start() -> bool:
    """Whether this start is one of the first FAKE_VLLM_MASTER_PORT_TAKEN_STARTS counted in the file
    FAKE_VLLM_MASTER_PORT_TAKEN names."""
    counter = os.environ.get("FAKE_VLLM_MASTER_PORT_TAKEN")
    if not counter:
        return False
    with open(counter, "a+") as f:
        f.write("start\n")
        f.seek(0)
        starts = len(f.read().splitlines())
    return starts <= int(os.environ.get("FAKE_VLLM_MASTER_PORT_TAKEN_STARTS", "1"))


def _master_port_taker(args: argparse.Namespace) -> socket.socket | None:
    """A socket that holds the master port, on the starts _port_taken_this_start() picks."""
    return socket.create_server((args.master_addr, args.master_port)) if _port_taken_this_start() else None


def _log_port_in_use(log: Logger, port: int) -> None:
    log("ERROR", "multiproc_executor.py:953", "WorkerProc failed to start.")
    log(
        "ERROR",
        "multiproc_executor.py:953",
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address."
        f" port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
    )


def _own_distributed_port_taken(log: Logger) -> bool:
    """On one node vLLM picks its workers' torch.distributed port itself; on the starts
    _port_taken_this_start() picks, another socket holds the one it picked."""
    if not _port_taken_this_start():
        return False
    with socket.create_server(("127.0.0.1", 0)) as taker:
        _log_port_in_use(log, taker.getsockname()[1])
    return True


def _rendezvous(args: argparse.Namespace, log: Logger) -> list[socket.socket] | None:
    """Rank 0: wait for every other rank to join (None when they did not in time)."""
    head = f"{args.master_addr}:{args.master_port}"
    taker = _master_port_taker(args)
    try:
        listening = socket.create_server((args.master_addr, args.master_port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        _log_port_in_use(log, args.master_port)
        return None
    finally:
        if taker is not None:
            taker.close()
    with listening as server:
        server.settimeout(_env_float("FAKE_VLLM_RENDEZVOUS_S", 60.0))
        peers = []
        try:
            while len(peers) < args.nnodes - 1:
                conn, _ = server.accept()
                conn.recv(16)
                peers.append(conn)
        except TimeoutError:
            log("ERROR", "parallel_state.py:1210", f"Timed out waiting for {args.nnodes - 1 - len(peers)} node(s) to join at {head}.")
            return None
    log("INFO", "parallel_state.py:1241", f"All {args.nnodes} nodes joined the torch.distributed group at {head}.")
    return peers


# Set once rank 0 is leaving: the other ranks' connections closing then is no failure.
_LEAVING = threading.Event()


def _watch_peers(peers: list[socket.socket], log: Logger) -> None:
    """A rank that goes away takes rank 0 (and so the server) down, as a lost vLLM worker does."""

    def watch(rank: int, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if conn.recv(1):
                return
        if _LEAVING.is_set():
            return
        log("ERROR", "core.py:1514", f"EngineCore encountered a fatal error: the worker on node rank {rank} died.", proc="EngineCore")
        os._exit(1)

    for rank, conn in enumerate(peers, start=1):
        threading.Thread(target=watch, args=(rank, conn), daemon=True).start()


async def _serve(args: argparse.Namespace, behavior: Behavior, cache_info: dict[str, str], log: Logger) -> int:
    ignore_sigterm = os.environ.get("FAKE_VLLM_IGNORE_SIGTERM") == "1"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    # Like vLLM, a SIGTERM while still starting up ends the server.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), _env_float("FAKE_VLLM_STARTUP_S", 0.0))
    if stop.is_set():
        return 0
    try:
        server = FakeVllmServer(behavior, host=args.host, port=args.port, cache_info=cache_info)
        await server.__aenter__()
    except OSError as exc:
        print(f"(APIServer pid={log.pid}) ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
              f"('{args.host}', {args.port}): {exc.strerror}", flush=True)
        return 1
    try:
        log("INFO", "entry.py:140", f"Starting vLLM server on http://{args.host}:{server.port}")
        print(f"(APIServer pid={log.pid}) INFO:     Started server process [{log.pid}]", flush=True)
        print(f"(APIServer pid={log.pid}) INFO:     Waiting for application startup.", flush=True)
        print(f"(APIServer pid={log.pid}) INFO:     Application startup complete.", flush=True)
        die_after_s = _env_float("FAKE_VLLM_DIE_AFTER_S", 0.0)
        die_after_requests = int(os.environ.get("FAKE_VLLM_DIE_AFTER_REQUESTS") or 0)
        fault = os.environ.get("FAKE_VLLM_FAULT")
        if fault:
            await _fault(server, fault, int(os.environ.get("FAKE_VLLM_FAULT_AFTER_REQUESTS") or 0), stop, log)
        if die_after_s or die_after_requests:
            ready_at = time.perf_counter()
            while not stop.is_set():
                timed_out = die_after_s and time.perf_counter() - ready_at >= die_after_s
                served = die_after_requests and server.stats.requests >= die_after_requests
                if timed_out or served:
                    log("ERROR", "core.py:1514", "EngineCore encountered a fatal error.", proc="EngineCore")
                    os._exit(int(os.environ.get("FAKE_VLLM_DIE_EXIT_CODE", "1")))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.02)
        await stop.wait()
        log("INFO", "launcher.py:110", "Shutting down FastAPI HTTP server.")
    finally:
        await server.close()
    return 0


async def _fault(server: FakeVllmServer, fault: str, after_requests: int, stop: asyncio.Event, log: Logger) -> None:
    """Wait for `after_requests` completion requests, then begin `fault` (see the docstring)."""
    if fault not in ("stop", "hang", "stall", "metrics_gone", "metrics_garbage", "oom"):
        raise SystemExit(f"FAKE_VLLM_FAULT={fault!r}: not a fault this fake knows")
    while server.stats.requests < after_requests and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)
    if stop.is_set():
        return
    match fault:
        case "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        case "hang":
            log("WARNING", "core.py:1200", "(fault) the event loop hangs", proc="EngineCore")
            time.sleep(ENGINE_MAX_LIFE_S)  # blocks the loop: nothing answers, SIGTERM included
        case "stall":
            server.behavior = dataclasses.replace(server.behavior, stall_streams=True)
        case "metrics_gone":
            server.behavior = dataclasses.replace(server.behavior, metrics=False)
        case "metrics_garbage":
            server.garbage_metrics = True
        case "oom":
            events = os.environ.get("FAKE_VLLM_OOM_EVENTS")
            if events:
                text = Path(events).read_text() if Path(events).exists() else "oom 0\noom_kill 0\n"
                lines = [
                    f"oom_kill {int(line.split()[1]) + 1}" if line.startswith("oom_kill ") else line
                    for line in text.splitlines()
                ]
                Path(events).write_text("\n".join(lines) + "\n")
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log = Logger(os.getpid())
    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    models = args.served_model_name or [args.model]

    # vLLM 0.32's banner carries the version and model (the art is cut down to one line here).
    log("INFO", "api_utils.py:347", f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {FAKE_VERSION}")
    log("INFO", "api_utils.py:347", f"  █▄█▀ █     █     █     █  model   {models[0]}")
    shown = {k: v for k, v in vars(args).items() if v != parser.get_default(k)}
    if "api_key" in shown:
        shown["api_key"] = [shown["api_key"]]  # vLLM logs the command-line key like this
    log("INFO", "utils.py:261", f"non-default args: {shown}")
    log("INFO", "model.py:1725", "Resolved architecture: LlamaForCausalLM")

    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    if args.nnodes > 1 and (tp * pp) % args.nnodes:
        return _config_error(
            log,
            f"Invalid data-parallel launch options: `--nnodes {args.nnodes}` must evenly divide the total world size ({tp * pp}).",
        )
    if not 0 <= args.node_rank < args.nnodes:
        return _config_error(
            log, f"Invalid data-parallel launch options: `--node-rank` must be between 0 and {args.nnodes - 1}; got `--node-rank {args.node_rank}`."
        )
    max_model_len = args.max_model_len or DERIVED_MAX_MODEL_LEN
    if max_model_len > DERIVED_MAX_MODEL_LEN:
        message = (
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={DERIVED_MAX_MODEL_LEN} or model_max_length=None in model's config.json)."
        )
        if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
            return _config_error(log, message)
        log("WARNING", "model.py:2660", message + " VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution.")
    if NUM_HEADS % tp != 0:
        return _config_error(
            log, f"Total number of attention heads ({NUM_HEADS}) must be divisible by tensor parallel size ({tp})."
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    default_gpus = len([d for d in visible.split(",") if d.strip()]) if visible else 1
    gpus = int(os.environ.get("FAKE_VLLM_GPUS", default_gpus))
    if tp * pp // args.nnodes > gpus:
        return _config_error(
            log,
            f"World size ({tp * pp // args.nnodes}) is larger than the number of available GPUs ({gpus}) in this node. "
            "If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.",
        )
    log("INFO", "model.py:1880", f"Using max model len {max_model_len}")
    if args.node_rank > 0:
        return _headless(args, log)
    peers: list[socket.socket] = []
    if args.nnodes > 1:
        joined = _rendezvous(args, log)
        if joined is None:
            return 1
        peers = joined
        _watch_peers(peers, log)
    elif _own_distributed_port_taken(log):
        return 1

    ignore_sigterm = os.environ.get("FAKE_VLLM_IGNORE_SIGTERM") == "1"
    engine = _start_engine_core(ignore_sigterm)
    engine_log = Logger(engine.pid)
    try:
        engine_log("INFO", "core.py:96", "Initializing a V1 LLM engine (v0.32.0) with config: fake", proc="EngineCore")
        engine_log("INFO", "cpu_model_runner.py:110", "Model loading took 0.0 GiB memory and 0.031250 seconds", proc="EngineCore")

        block_size = args.block_size or DEFAULT_BLOCK_SIZE
        bytes_per_token = NUM_LAYERS * 2 * max(1, NUM_KV_HEADS // tp) * HEAD_DIM * DTYPE_BYTES
        if args.kv_cache_memory_bytes is not None:
            kv_bytes = args.kv_cache_memory_bytes
            engine_log("INFO", "cpu_worker.py:233", f"Explicitly set ({round(kv_bytes / GiB, 2)}/15.62) GiB for KV cache on node 0.", proc="EngineCore")
        else:
            device = human_readable_int(os.environ.get("FAKE_VLLM_DEVICE_MEMORY", "16M"))
            weights = human_readable_int(os.environ.get("FAKE_VLLM_WEIGHTS", "4M"))
            kv_bytes = int(args.gpu_memory_utilization * device) - weights
            engine_log("INFO", "gpu_worker.py:760", f"Available KV cache memory: {round(kv_bytes / GiB, 2)} GiB", proc="EngineCore")
        page = block_size * bytes_per_token
        num_blocks = max(0, kv_bytes) // page
        usable_bytes = (num_blocks - 1) * page
        if num_blocks <= 1:
            return _engine_error(
                log,
                engine_log,
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
                "despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
            )
        blocks_per_request = math.ceil(max_model_len / block_size)
        needed = blocks_per_request * page
        if needed > usable_bytes:
            estimated = (num_blocks - 1) * block_size
            estimated_msg = (
                f"Based on the available memory, the estimated maximum model length is {estimated}. " if estimated > 0 else ""
            )
            return _engine_error(
                log,
                engine_log,
                f"To serve at least one request with the model's max seq len ({max_model_len}), "
                f"({round(needed / GiB, 2)} GiB KV cache is needed, which is larger than the available KV cache "
                f"memory ({round(usable_bytes / GiB, 2)} GiB). {estimated_msg}Try increasing "
                "`gpu_memory_utilization` (which also controls CPU memory reservation on the CPU backend, despite "
                "its name) or decreasing `max_model_len` when initializing the engine. See "
                "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
            )
        max_concurrency = num_blocks / blocks_per_request
        kv_tokens = int(max_concurrency * max_model_len)
        engine_log(
            "INFO",
            "kv_cache_utils.py:2327",
            f"CPU KV cache size: {kv_tokens:,} tokens, Maximum concurrency for {max_model_len:,} tokens per request: {max_concurrency:.2f}x",
            proc="EngineCore",
        )
        engine_log("INFO", "core.py:403", "init engine (profile, create kv cache, warmup model) took 0.05 s", proc="EngineCore")

        behavior = Behavior(
            ttft_s=_env_float("FAKE_VLLM_TTFT_S", 0.02),
            itl_s=_env_float("FAKE_VLLM_ITL_S", 0.01) * _start_factor(),
            ttft_growth_per_running=_env_float("FAKE_VLLM_TTFT_GROWTH", 0.05),
            itl_growth_per_running=itl_growth(args.max_num_batched_tokens),
            slowness_sigma=_env_float("FAKE_VLLM_SLOWNESS_SIGMA", 0.0),
            step_sigma=_env_float("FAKE_VLLM_STEP_SIGMA", 0.0),
            preemption_rate=_env_float("FAKE_VLLM_PREEMPTION_RATE", 0.0),
            max_num_seqs=args.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            kv_cache_tokens=kv_tokens,
            max_model_len=max_model_len,
            models=models,
            api_key=api_key,
            metrics=not args.disable_log_stats,
            seed=args.seed,
            prefix_caching=args.enable_prefix_caching is not False,
        )
        cache_info = {
            "block_size": str(block_size),
            "cache_dtype": "auto",
            # vLLM V1 caches prefixes unless told not to.
            "enable_prefix_caching": str(args.enable_prefix_caching is not False),
            "gpu_memory_utilization": str(args.gpu_memory_utilization),
            "kv_cache_max_concurrency": str(max_concurrency),
            "kv_cache_memory_bytes": str(kv_bytes),
            "kv_cache_size_tokens": str(kv_tokens),
            "num_gpu_blocks": str(num_blocks),
        }
        return asyncio.run(_serve(args, behavior, cache_info, log))
    finally:
        _LEAVING.set()
        with contextlib.suppress(ProcessLookupError):
            engine.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            engine.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
