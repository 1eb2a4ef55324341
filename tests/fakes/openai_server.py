"""A fake OpenAI-style streaming server with vLLM's wire format, for tests and the client benchmark.

Standard library asyncio only: HTTP/1.1 with keep-alive, chunked transfer encoding for SSE.
In-process use:

    async with FakeServer(Behavior(ttft_s=0.05, itl_s=0.01)) as srv:
        ...  # srv.url, srv.port, srv.stats; assign srv.behavior to change it live

As a process (prints one ready line ``fake-openai-server ready on http://HOST:PORT``, serves until
SIGTERM or SIGINT):

    python tests/fakes/openai_server.py --host 127.0.0.1 --port 0 --ttft-s 0.05 --itl-s 0.01

Endpoints: GET /health, /version, /v1/models, /metrics; POST /v1/completions,
/v1/chat/completions, /tokenize. With ``api_key`` set, /v1/* answers 401 without
``Authorization: Bearer KEY`` (as vLLM's --api-key does; /health, /metrics, /tokenize stay open).

The fake tokenizer is deterministic: one token per started 4 bytes of UTF-8 text
(``ceil(len(utf8) / 4)``); a chat request counts every message's text that way plus
``CHAT_TOKENS_PER_MESSAGE`` for the template. Generated tokens are the texts " t0", " t1", ...

Capacity model (vLLM-like and coarse, for sweeps):
- A request is admitted, first come first served, when fewer than ``max_num_seqs`` run and its
  prompt fits in the free KV pool of ``kv_cache_tokens``; until then it waits, so TTFT grows.
- Each generated token takes one more KV slot. When the pool is full, the request that needs the
  slot is preempted: its KV is freed, it goes to the head of the queue, and on readmission it pays
  the prefill (TTFT) again, as vLLM's recompute preemption does. A preemption is counted.
- ``itl = itl_s * (1 + itl_growth_per_running * running)``; TTFT likewise with its own factor.
- With ``slowness_sigma`` every request draws a factor from a lognormal (median 1) that scales
  all its inter-token gaps, so a request's TPOT is ``itl * factor``: a known law for percentiles.
- With ``step_sigma`` a second lognormal factor (median 1) scales every request's gaps alike; it
  is drawn anew when a request arrives at a server that sat idle (nothing running or waiting) for
  at least ``step_idle_s``: between a planner's steps, which drain before the next one. It stands
  for what a step cannot see from inside (the server's state, the corpus's draw), so repeated
  steps at one load differ by more than one step's own spread.
- With ``preemption_rate`` a request is preempted once, at a random token, with probability
  ``preemption_rate x running`` (capped at 1): counted, its KV freed and its prefill paid again,
  as vLLM's recompute preemption does. Rare events whose count grows with the window's length.

/metrics carries vLLM's gauges and counters and, like vLLM 0.32, its latency histograms (same
names, buckets and labels, rendered by prometheus_client as vLLM does), observed on the server's
clock: queue = arrival to admission, prefill = admission to the first token, TTFT = arrival to
the first token, ITL = each token's gap, decode = first to last token, TPOT = decode / (n - 1),
e2e = arrival to the last token. Only requests that ran to the end are observed.

Fault draws (error_rate, disconnect_rate, error_event_rate) come from one ``random.Random(seed)``
created when the server starts, so a test's sequence of faults is reproducible.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

CHAT_TOKENS_PER_MESSAGE = 4
# A few tokens reach the client before an injected disconnect or error event, as with a real
# failure mid-generation.
FAULT_AFTER_TOKENS = 3
FAKE_VERSION = "0.0.0-fake"
BLOCK_SIZE = 16
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


@dataclass
class Behavior:
    """How the fake server answers. Assign a new one to ``FakeServer.behavior`` to change it live."""

    ttft_s: float = 0.0
    itl_s: float = 0.0
    # Used when a request carries no max_tokens.
    output_tokens: int = 16
    # Fractions of completion requests that fail: HTTP 500 before streaming; socket closed
    # mid-stream; a `data: {"error": ...}` event mid-stream.
    error_rate: float = 0.0
    disconnect_rate: float = 0.0
    error_event_rate: float = 0.0
    # Send the usage chunk when the request asks for it with stream_options.include_usage.
    send_usage: bool = True
    api_key: str | None = None
    models: list[str] = field(default_factory=lambda: ["fake-model"])
    max_model_len: int = 4096
    seed: int = 0
    metrics: bool = True
    max_num_seqs: int | None = None
    kv_cache_tokens: int | None = None
    itl_growth_per_running: float = 0.0
    ttft_growth_per_running: float = 0.0
    slowness_sigma: float = 0.0
    # A factor shared by every request between two idle spells (see the module docstring).
    step_sigma: float = 0.0
    # Short of the planner's pause between two steps (22-56 ms measured on a 2-core machine), so
    # each step draws its own factor; at 50 ms about half the pauses kept the last step's.
    step_idle_s: float = 0.005
    # Probability per request, per request running, of one spurious preemption.
    preemption_rate: float = 0.0
    # vLLM's prefix cache as counters only: vllm:prefix_cache_queries/hits (see PrefixCache).
    prefix_caching: bool = True
    # Streams stop after their first tokens and send nothing more, the connection left open (a
    # stuck engine behind an API server that still answers /health).
    stall_streams: bool = False

    def __post_init__(self) -> None:
        for name in ("error_rate", "disconnect_rate", "error_event_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"Behavior.{name}={value!r}: must be a fraction in [0, 1]")
        for name in ("ttft_s", "itl_s", "itl_growth_per_running", "ttft_growth_per_running", "slowness_sigma",
                     "step_sigma", "step_idle_s", "preemption_rate"):
            if getattr(self, name) < 0:
                raise ValueError(f"Behavior.{name}={getattr(self, name)!r}: must be >= 0")
        for name in ("output_tokens", "max_model_len", "max_num_seqs", "kv_cache_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"Behavior.{name}={value!r}: must be a positive integer")
        if not self.models:
            raise ValueError("Behavior.models is empty: serve at least one model id")


@dataclass
class ServerStats:
    requests: int = 0  # completion and chat requests received, failed ones included
    completed: int = 0  # streams (or bodies) that ran to the end
    running: int = 0
    waiting: int = 0
    peak_running: int = 0
    peak_waiting: int = 0
    preemptions: int = 0
    kv_used_tokens: int = 0
    peak_kv_usage: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    connections: int = 0  # TCP connections accepted
    paths: collections.Counter[str] = field(default_factory=collections.Counter)


def count_text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


def fake_token_ids(text: str) -> list[int]:
    data = text.encode("utf-8")
    return [int.from_bytes(data[i : i + 4], "little") % 32000 for i in range(0, len(data), 4)]


def fake_prompt_ids(payload: dict[str, Any]) -> list[int]:
    """The token ids of a completion's prompt or a chat's messages; each message starts with
    CHAT_TOKENS_PER_MESSAGE template ids (its role), so len() is the /tokenize count."""
    if isinstance(payload.get("messages"), list):
        ids: list[int] = []
        for m in payload["messages"]:
            role = m.get("role") if isinstance(m, dict) else None
            ids += [32000 + hash(str(role)) % 1000] * CHAT_TOKENS_PER_MESSAGE + fake_token_ids(_message_text(m))
        return ids
    return fake_token_ids(payload.get("prompt") or "")


class PrefixCache:
    """vLLM's prefix-cache counters, unbounded: full BLOCK_SIZE blocks named by hashes chained on
    their parent's; a prompt hits its longest run of cached leading blocks, at most
    (n - 1) // BLOCK_SIZE of them (the last token is always computed); queries count its tokens.
    It changes no KV accounting: the capacity model above is unaware of sharing."""

    def __init__(self) -> None:
        self._blocks: set[int] = set()

    def lookup(self, ids: list[int]) -> int:
        """Hit tokens of this prompt; its full blocks are cached from now on."""
        parent, hashes = 0, []
        for start in range(0, len(ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
            parent = hash((parent, tuple(ids[start : start + BLOCK_SIZE])))
            hashes.append(parent)
        hit = 0
        for h in hashes[: max(0, len(ids) - 1) // BLOCK_SIZE]:
            if h not in self._blocks:
                break
            hit += 1
        self._blocks.update(hashes)
        return hit * BLOCK_SIZE


def _message_text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def count_messages_tokens(messages: list[Any]) -> int:
    return sum(count_text_tokens(_message_text(m)) + CHAT_TOKENS_PER_MESSAGE for m in messages)


class _HttpError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type_, "param": param, "code": status}}


class _Capacity:
    """Admission and KV accounting of the fake engine (see the module docstring)."""

    def __init__(self, server: FakeServer) -> None:
        self._server = server
        self._queue: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def _stats(self) -> ServerStats:
        return self._server.stats

    def _fits(self, need_tokens: int) -> bool:
        b = self._server.behavior
        stats = self._stats
        if stats.running == 0:
            # A request larger than the whole pool still runs alone, rather than deadlocking.
            return True
        if b.max_num_seqs is not None and stats.running >= b.max_num_seqs:
            return False
        return b.kv_cache_tokens is None or stats.kv_used_tokens + need_tokens <= b.kv_cache_tokens

    def _start(self, need_tokens: int) -> None:
        stats = self._stats
        stats.running += 1
        stats.peak_running = max(stats.peak_running, stats.running)
        self._use(need_tokens)

    def _use(self, tokens: int) -> None:
        stats = self._stats
        stats.kv_used_tokens += tokens
        pool = self._server.behavior.kv_cache_tokens
        if pool:
            stats.peak_kv_usage = max(stats.peak_kv_usage, min(1.0, stats.kv_used_tokens / pool))

    async def admit(self, need_tokens: int, *, front: bool = False) -> None:
        if not self._queue and self._fits(need_tokens):
            self._start(need_tokens)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (need_tokens, fut)
        if front:
            self._queue.appendleft(entry)
        else:
            self._queue.append(entry)
        self._stats.waiting += 1
        self._stats.peak_waiting = max(self._stats.peak_waiting, self._stats.waiting)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # Admitted in the same tick as the cancel: give the slot back.
                self.release(need_tokens)
            else:
                self._dequeue(entry)
            raise

    def _dequeue(self, entry: tuple[int, asyncio.Future[None]]) -> None:
        # Whoever takes an entry out of the queue counts it out of `waiting`, exactly once.
        try:
            self._queue.remove(entry)
        except ValueError:
            return
        self._stats.waiting -= 1

    def release(self, held_tokens: int) -> None:
        stats = self._stats
        stats.running -= 1
        stats.kv_used_tokens -= held_tokens
        self._wake()

    def _wake(self) -> None:
        # Strict FIFO like vLLM's FCFS scheduler: the head blocks everyone behind it.
        while self._queue:
            need, fut = self._queue[0]
            if not fut.cancelled() and not self._fits(need):
                return
            self._queue.popleft()
            self._stats.waiting -= 1
            if not fut.cancelled():
                self._start(need)
                fut.set_result(None)

    def grow(self) -> bool:
        """Take one KV slot for a new token; False when the pool is full (preempt the caller)."""
        b = self._server.behavior
        stats = self._stats
        if b.kv_cache_tokens is not None and stats.running > 1 and stats.kv_used_tokens + 1 > b.kv_cache_tokens:
            return False
        self._use(1)
        return True

    def preempt(self, held_tokens: int) -> None:
        stats = self._stats
        stats.preemptions += 1
        stats.running -= 1
        stats.kv_used_tokens -= held_tokens
        # Do not wake here: the caller queues itself at the head first (vLLM re-queues a
        # preempted request in front of the others), then admit() waits for room.


# vLLM 0.32's buckets (vllm/v1/metrics/loggers.py), as its /metrics shows them.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)


class _LatencyHistograms:
    """vLLM's per-request latency histograms, in a registry of the server's own."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")

        def hist(name: str, help_: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_, labels, buckets=buckets, registry=self.registry)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _TOKEN_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", _TOKEN_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _REQUEST_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _REQUEST_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _REQUEST_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _REQUEST_BUCKETS)
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", (*labels, "finished_reason"), registry=self.registry
        )
        # vLLM creates its series at start-up, so /metrics shows them (at zero) before any request.
        for h in (self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.prefill, self.decode):
            h.labels(model_name=model, engine="0")
        self.success.labels(model_name=model, engine="0", finished_reason="length")

    def observe(self, model: str, arrival: float, admitted: float, token_times: list[float]) -> None:
        first, last = token_times[0], token_times[-1]
        lab = {"model_name": model, "engine": "0"}
        self.queue.labels(**lab).observe(admitted - arrival)
        self.prefill.labels(**lab).observe(first - admitted)
        self.ttft.labels(**lab).observe(first - arrival)
        for a, b in zip(token_times, token_times[1:]):
            self.itl.labels(**lab).observe(b - a)
        self.decode.labels(**lab).observe(last - first)
        if len(token_times) > 1:
            self.tpot.labels(**lab).observe((last - first) / (len(token_times) - 1))
        self.e2e.labels(**lab).observe(last - arrival)
        self.success.labels(**lab, finished_reason="length").inc()


class FakeServer:
    def __init__(self, behavior: Behavior | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.behavior = behavior if behavior is not None else Behavior()
        self.host = host
        self.port = port
        self.stats = ServerStats()
        # The last completion request as received, for tests that check what the client sent.
        self.last_json: dict[str, Any] | None = None
        # Every completion request as received, with its arrival (loop time), when a test sets a list here.
        self.received: list[tuple[float, dict[str, Any]]] | None = None
        self.last_headers: dict[str, str] = {}
        self._rng = random.Random(self.behavior.seed)
        # The step factor and spurious preemptions draw from their own stream, so a test's fault
        # sequence stays what it was without them.
        self._noise_rng = random.Random(self.behavior.seed + 1)
        self._step_factor = 1.0
        self._idle_since: float | None = None
        self._capacity = _Capacity(self)
        self._prefix_cache = PrefixCache()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._outer: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._counter = 0
        self.histograms = _LatencyHistograms(self.behavior.models[0])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> FakeServer:
        self._rng = random.Random(self.behavior.seed)
        self._noise_rng = random.Random(self.behavior.seed + 1)
        self._server = await asyncio.start_server(self._connection, self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        outer = list(self._outer)
        await asyncio.gather(*outer, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def drop_connections(self) -> None:
        """Close every open connection at once, as a server does with idle keep-alive ones."""
        for writer in list(self._writers):
            writer.transport.abort()

    # --- HTTP/1.1 ---------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The work runs in an inner task that close() may cancel; this callback task itself must
        # end normally, because Python 3.11's stream protocol calls task.exception() on it, which
        # raises for a cancelled task and logs a traceback.
        outer = asyncio.current_task()
        inner = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(inner)
        if outer is not None:
            self._outer.add(outer)
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            if not inner.done():
                inner.cancel()
        finally:
            self._tasks.discard(inner)
            if outer is not None:
                self._outer.discard(outer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.stats.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._send_json(writer, 431, {"error": "request head too large"}, close=True)
                    return
                lines = head.decode("latin-1").split("\r\n")
                try:
                    method, target, _ = lines[0].split(" ", 2)
                except ValueError:
                    return
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                keep = await self._dispatch(method, target.split("?", 1)[0], headers, body, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _send_json(
        self, writer: asyncio.StreamWriter, status: int, obj: Any, *, close: bool = False
    ) -> None:
        body = json.dumps(obj).encode()
        await self._send(writer, status, body, "application/json", close=close)

    async def _send(
        self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, *, close: bool = False
    ) -> None:
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            f"connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()

    async def _dispatch(
        self, method: str, path: str, headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        self.stats.paths[path] += 1
        b = self.behavior
        if path.startswith("/v1/") and b.api_key is not None:
            if headers.get("authorization") != f"Bearer {b.api_key}":
                await self._send_json(writer, 401, {"error": "Unauthorized"})
                return True
        routes_get = {"/health", "/version", "/v1/models", "/metrics"}
        routes_post = {"/v1/completions", "/v1/chat/completions", "/tokenize"}
        if path not in routes_get and path not in routes_post:
            await self._send_json(writer, 404, {"detail": "Not Found"})
            return True
        if (path in routes_get and method != "GET") or (path in routes_post and method != "POST"):
            await self._send_json(writer, 405, {"detail": "Method Not Allowed"})
            return True
        try:
            match path:
                case "/health":
                    await self._send(writer, 200, b"", "application/json")
                case "/version":
                    await self._send_json(writer, 200, {"version": FAKE_VERSION})
                case "/v1/models":
                    data = [
                        {"id": m, "object": "model", "owned_by": "vllm", "root": m, "max_model_len": b.max_model_len}
                        for m in b.models
                    ]
                    await self._send_json(writer, 200, {"object": "list", "data": data})
                case "/metrics":
                    if not b.metrics:
                        await self._send_json(writer, 404, {"detail": "Not Found"})
                    else:
                        await self._send(writer, 200, self.metrics_text().encode(), "text/plain; version=0.0.4")
                case "/tokenize":
                    await self._tokenize(writer, _parse_json(body))
                case _:
                    payload = _parse_json(body)
                    self.last_json = payload
                    if self.received is not None:
                        self.received.append((asyncio.get_running_loop().time(), payload))
                    self.last_headers = headers
                    return await self._generate(writer, path == "/v1/chat/completions", payload)
        except _HttpError as exc:
            await self._send_json(writer, exc.status, exc.body)
        return True

    async def _tokenize(self, writer: asyncio.StreamWriter, payload: dict[str, Any]) -> None:
        if isinstance(payload.get("messages"), list):
            count = count_messages_tokens(payload["messages"])
        elif isinstance(payload.get("prompt"), str):
            count = count_text_tokens(payload["prompt"])
        else:
            raise _HttpError(400, "give either 'prompt' (a string) or 'messages' (a list)")
        tokens = fake_prompt_ids(payload)
        await self._send_json(writer, 200, {"count": count, "max_model_len": self.behavior.max_model_len, "tokens": tokens})

    # --- generation -----------------------------------------------------------------------------

    def _validate(self, chat: bool, payload: dict[str, Any]) -> tuple[str, int, int]:
        b = self.behavior
        model = payload.get("model") or b.models[0]
        if model not in b.models:
            raise _HttpError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if chat:
            messages = payload.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _HttpError(400, "'messages' must be a non-empty list")
            prompt_tokens = count_messages_tokens(messages)
        else:
            prompt = payload.get("prompt")
            if not isinstance(prompt, str):
                raise _HttpError(400, "'prompt' must be a string")
            prompt_tokens = count_text_tokens(prompt)
        if prompt_tokens > b.max_model_len:
            raise _HttpError(
                400,
                f"This model's maximum context length is {b.max_model_len} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            )
        max_tokens = payload.get("max_tokens")
        if max_tokens is None:
            max_tokens = b.output_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _HttpError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens")
        # vLLM silently clamps prompt + max_tokens to max_model_len.
        return model, prompt_tokens, max(1, min(max_tokens, b.max_model_len - prompt_tokens))

    async def _generate(self, writer: asyncio.StreamWriter, chat: bool, payload: dict[str, Any]) -> bool:
        self.stats.requests += 1
        model, prompt_tokens, n_tokens = self._validate(chat, payload)
        b = self.behavior
        if b.prefix_caching:
            self.stats.prefix_cache_queries += prompt_tokens
            self.stats.prefix_cache_hits += self._prefix_cache.lookup(fake_prompt_ids(payload))
        if b.error_rate and self._rng.random() < b.error_rate:
            raise _HttpError(500, "injected server error", "InternalServerError")
        disconnect = bool(b.disconnect_rate) and self._rng.random() < b.disconnect_rate
        error_event = bool(b.error_event_rate) and self._rng.random() < b.error_event_rate
        fault_at = min(FAULT_AFTER_TOKENS, n_tokens - 1)
        self._counter += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-fake{self._counter}"
        created = int(time.time())
        stream = bool(payload.get("stream"))
        opts = payload.get("stream_options")
        usage_wanted = b.send_usage and (not stream or (isinstance(opts, dict) and bool(opts.get("include_usage"))))
        chunk = _ChunkFormat(rid, created, model, chat)

        if stream:
            # Like Starlette's StreamingResponse, headers go out before the first token exists.
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
            )
            await writer.drain()

        loop = asyncio.get_running_loop()
        capacity = self._capacity
        arrival = loop.time()
        slowness = self._rng.lognormvariate(0.0, b.slowness_sigma) if b.slowness_sigma else 1.0
        slowness *= self._shared_factor(arrival)
        preempt_at = self._spurious_preemption(n_tokens)
        await capacity.admit(prompt_tokens)
        admitted = loop.time()
        held = prompt_tokens
        running_now = True
        texts: list[str] = []
        token_times: list[float] = []
        try:
            deadline = loop.time() + self._ttft()
            for i in range(n_tokens):
                if i:
                    deadline += self._itl() * slowness
                delay = deadline - loop.time()
                # sleep(0) still yields, so many zero-delay streams share the loop fairly.
                await asyncio.sleep(delay if delay > 0 else 0)
                if i == preempt_at or not capacity.grow():
                    capacity.preempt(held)
                    running_now = False
                    need = held + 1
                    await capacity.admit(need, front=True)
                    running_now = True
                    held = need
                    # Recompute preemption: the prefill is paid again.
                    await asyncio.sleep(self._ttft())
                    deadline = loop.time()
                else:
                    held += 1
                token_times.append(loop.time())
                text = f" t{i}"
                texts.append(text)
                self.stats.generation_tokens += 1
                if not stream:
                    continue
                last = i == n_tokens - 1
                if chat and i == 0:
                    _write_chunk(writer, chunk.role())
                _write_chunk(writer, chunk.token(text, last))
                if disconnect and i == fault_at:
                    await writer.drain()
                    writer.transport.abort()
                    return False
                if b.stall_streams and i == fault_at:
                    await writer.drain()
                    await asyncio.Event().wait()  # until the client gives up or the server closes
                if error_event and i == fault_at:
                    err = {"error": {"message": "injected error mid-stream", "type": "InternalServerError", "param": None, "code": 500}}
                    _write_chunk(writer, f"data: {json.dumps(err)}\n\n")
                    break
                await writer.drain()
        finally:
            if running_now:
                capacity.release(held)
            if self.stats.running == 0 and self.stats.waiting == 0:
                self._idle_since = loop.time()
        self.stats.prompt_tokens += prompt_tokens
        if not stream:
            await self._send_json(writer, 200, chunk.full_body("".join(texts), prompt_tokens, len(texts), usage_wanted))
            self.stats.completed += 1
            return True
        if usage_wanted and not error_event:
            _write_chunk(writer, chunk.usage(prompt_tokens, len(texts)))
        _write_chunk(writer, "data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        if not error_event:
            self.stats.completed += 1
            self.histograms.observe(b.models[0], arrival, admitted, token_times)
        return True

    def _shared_factor(self, arrival: float) -> float:
        """The step factor: drawn anew for a request that finds the server idle for step_idle_s
        (or is its first)."""
        b = self.behavior
        if not b.step_sigma:
            return 1.0
        idle = self.stats.running == 0 and self.stats.waiting == 0
        fresh = self.stats.requests == 1 or (
            idle and self._idle_since is not None and arrival - self._idle_since >= b.step_idle_s
        )
        if fresh:
            self._step_factor = self._noise_rng.lognormvariate(0.0, b.step_sigma)
        return self._step_factor

    def _spurious_preemption(self, n_tokens: int) -> int | None:
        """The token (1..n-1) at which this request is preempted, or None."""
        b = self.behavior
        if not b.preemption_rate or n_tokens < 2:
            return None
        if self._noise_rng.random() >= min(1.0, b.preemption_rate * (self.stats.running + 1)):
            return None
        return self._noise_rng.randrange(1, n_tokens)

    def _ttft(self) -> float:
        b = self.behavior
        return b.ttft_s * (1 + b.ttft_growth_per_running * self.stats.running)

    def _itl(self) -> float:
        b = self.behavior
        return b.itl_s * (1 + b.itl_growth_per_running * self.stats.running)

    # --- metrics --------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        b = self.behavior
        s = self.stats
        labels = f'engine="0",model_name="{b.models[0]}"'
        usage = 0.0 if not b.kv_cache_tokens else min(1.0, s.kv_used_tokens / b.kv_cache_tokens)
        rows = [
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", s.running),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", s.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage),
        ]
        out: list[str] = []
        for name, kind, help_, value in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {float(value)}"]
        counters = [
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens),
        ]
        if b.prefix_caching:
            counters += [
                ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", s.prefix_cache_queries),
                ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_cache_hits),
            ]
        for name, help_, value in counters:
            out += [f"# HELP {name}_total {help_}", f"# TYPE {name}_total counter", f"{name}_total{{{labels}}} {float(value)}"]
        if b.kv_cache_tokens:
            blocks = b.kv_cache_tokens // BLOCK_SIZE
            info = {
                "block_size": str(BLOCK_SIZE),
                "cache_dtype": "auto",
                "enable_prefix_caching": str(b.prefix_caching),
                "gpu_memory_utilization": "0.92",
                "kv_cache_max_concurrency": f"{b.kv_cache_tokens / b.max_model_len:.1f}",
                "kv_cache_size_tokens": str(b.kv_cache_tokens),
                "num_gpu_blocks": str(blocks),
                "engine": "0",
            }
            label_text = ",".join(f'{k}="{v}"' for k, v in info.items())
            out += [
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                f"vllm:cache_config_info{{{label_text}}} 1.0",
            ]
        return "\n".join(out) + "\n" + generate_latest(self.histograms.registry).decode()


class _ChunkFormat:
    """vLLM's streamed chunk shapes, pre-rendered around the parts that change (the hot path)."""

    def __init__(self, rid: str, created: int, model: str, chat: bool) -> None:
        self.rid, self.created, self.model, self.chat = rid, created, model, chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = f'data: {{"id":"{rid}","object":"{obj}","created":{created},"model":{json.dumps(model)},'

    def role(self) -> str:
        return (
            self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def token(self, text: str, last: bool) -> str:
        finish = '"length"' if last else "null"
        if self.chat:
            return (
                self._head + f'"choices":[{{"index":0,"delta":{{"content":{json.dumps(text)}}},'
                f'"logprobs":null,"finish_reason":{finish}}}]}}\n\n'
            )
        return (
            self._head + f'"choices":[{{"index":0,"text":{json.dumps(text)},"logprobs":null,'
            f'"finish_reason":{finish},"stop_reason":null}}]}}\n\n'
        )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        total = prompt_tokens + completion_tokens
        return (
            self._head + f'"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},'
            f'"total_tokens":{total},"completion_tokens":{completion_tokens}}}}}\n\n'
        )

    def full_body(self, text: str, prompt_tokens: int, completion_tokens: int, usage: bool) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        body: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if usage:
            body["usage"] = {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
            }
        return body


def _write_chunk(writer: asyncio.StreamWriter, event: str) -> None:
    data = event.encode()
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body or b"{}")
    except ValueError as exc:
        raise _HttpError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _HttpError(400, "request body must be a JSON object")
    return payload


# --- process mode -------------------------------------------------------------------------------


def _optional_int(text: str) -> int | None:
    return None if text.lower() in ("", "none") else int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Fake OpenAI-style (vLLM-flavoured) streaming server for tests.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed in the ready line)")
    d = Behavior()
    p.add_argument("--ttft-s", type=float, default=d.ttft_s)
    p.add_argument("--itl-s", type=float, default=d.itl_s)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--error-rate", type=float, default=d.error_rate)
    p.add_argument("--disconnect-rate", type=float, default=d.disconnect_rate)
    p.add_argument("--error-event-rate", type=float, default=d.error_event_rate)
    p.add_argument("--no-usage", dest="send_usage", action="store_false", help="never send the usage chunk")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", dest="models", action="append", help="a served model id (repeatable)")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-metrics", dest="metrics", action="store_false", help="make /metrics answer 404")
    p.add_argument("--max-num-seqs", type=_optional_int, default=None)
    p.add_argument("--kv-cache-tokens", type=_optional_int, default=None)
    p.add_argument("--itl-growth-per-running", type=float, default=d.itl_growth_per_running)
    p.add_argument("--ttft-growth-per-running", type=float, default=d.ttft_growth_per_running)
    p.add_argument("--slowness-sigma", type=float, default=d.slowness_sigma, help="per-request lognormal factor on every gap")
    p.add_argument("--step-sigma", type=float, default=d.step_sigma, help="lognormal factor shared until the server idles")
    p.add_argument("--step-idle-s", type=float, default=d.step_idle_s, help="idle time after which the step factor is drawn anew")
    p.add_argument("--preemption-rate", type=float, default=d.preemption_rate, help="spurious preemptions per request per request running")
    return p


def behavior_from_args(args: argparse.Namespace) -> Behavior:
    fields = {k: v for k, v in vars(args).items() if k not in ("host", "port")}
    if not fields.get("models"):
        fields["models"] = Behavior().models
    return Behavior(**fields)


async def serve(behavior: Behavior, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with FakeServer(behavior, host=host, port=port) as srv:
        print(f"{READY_PREFIX}{srv.url}", flush=True)
        await stop.wait()



READY_PREFIX = "fake-openai-server ready on "


def start_process(log: Path, *args: str, ready_timeout_s: float = 15.0) -> tuple[subprocess.Popen, str]:
    """Run this server as its own process (output to `log`, so no pipe is left unread) and wait
    for its ready line; returns the process and its URL. Raises RuntimeError, with the server's
    output, if it never gets ready."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, __file__, *args], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.perf_counter() + ready_timeout_s
    while time.perf_counter() < deadline and proc.poll() is None:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(READY_PREFIX):
                return proc, line[len(READY_PREFIX) :].strip()
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"the fake server did not start (args {args}); its output:\n{log.read_text(errors='replace')}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        behavior = behavior_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(behavior, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
