"""The streaming client: one request of the corpus in, one `RequestRecord` out.

One `httpx.AsyncClient` serves a whole run, configured for load testing rather than for httpx's
defaults: a pool as large as the concurrency (the default 100 connections would silently cap a
sweep) and timeouts sized to the longest generation (the default 5 s would fail every long one).
Its transport is `LoadTransport` (below), which holds up to `max_connections` connections, all
kept alive, because httpcore's pool costs more than the streams at a few hundred of them; tests
pass an `httpx.MockTransport` instead.

`send()` never raises for a failure of the request itself; it records one error kind:

    connect         no connection could be made (refused, unresolvable, connect timeout)
    timeout         no complete answer within request_timeout_s (or a read/pool timeout)
    http_<status>   the server answered with a status other than 200
    broken_stream   the connection dropped, the stream ended without [DONE], or a chunk was not
                    JSON
    server_error    an error object inside a 200 stream (vLLM sends `data: {"error": {...}}`)

The server API calls (`check`, `list_models`, `tokenize`, `version`, `metrics_text`) are used
before any load is applied; `check` and friends raise `replay.errors.ServerError`s.
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

import httpx

from replay.errors import AuthError, ModelNotServed, ReplayError, ServerError, ServerUnreachable
from replay.records import RequestRecord
from replay.sse import DONE, SSEParser

Api = Literal["completions", "chat"]
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
# Keys the client sets itself; extra_body may not override them, because the measurement
# depends on them (streaming, the usage chunk) or a setting of its own already controls them.
RESERVED_BODY_KEYS = frozenset({"model", "prompt", "messages", "stream", "stream_options", "max_tokens", "ignore_eos"})
# How much of an error response body is read to explain an http_<status>.
ERROR_BODY_MAX_BYTES = 4096
DETAIL_MAX_CHARS = 200


class CorpusRequestLike(Protocol):
    """What the client reads of a replay.corpus.CorpusRequest."""

    id: str
    prompt: str | None
    messages: list[dict] | None
    max_tokens: int | None


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_MAX_CHARS else text[: DETAIL_MAX_CHARS - 3] + "..."


def _error_message(body: bytes) -> str:
    """The message inside an OpenAI/vLLM error body, else the body itself."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return _short(text) or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if isinstance(err.get(key), str):
                    return _short(err[key])
        elif isinstance(err, str):
            return _short(err)
    return _short(text)


def normalize_base_url(url: str) -> str:
    """The server root: accepts `http://host:8000`, with or without a trailing `/` or `/v1`."""
    root = url.strip().rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    if not root.startswith(("http://", "https://")) or len(root.split("://", 1)[1]) == 0:
        raise ReplayError(f"server URL {url!r} is not valid: give http://HOST:PORT (or https://...)")
    return root


class StreamingClient:
    """Streams requests to an OpenAI-compatible server (vLLM) and times every chunk.

    `api` picks the endpoint for prompt requests (`completions`: /v1/completions with `prompt`;
    `chat`: /v1/chat/completions with the prompt as one user message). Requests that carry
    `messages` always go to /v1/chat/completions: the completions API cannot carry them.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None,
        api: Api = "completions",
        api_key: str | None = None,
        max_connections: int = 100,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        ignore_eos: bool = True,
        default_max_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if api not in ("completions", "chat"):
            raise ReplayError(f"api {api!r} is not valid: use 'completions' or 'chat'")
        if max_connections < 1:
            raise ReplayError(f"max_connections={max_connections}: must be at least 1")
        if request_timeout_s <= 0 or connect_timeout_s <= 0:
            raise ReplayError(
                f"request_timeout_s={request_timeout_s}, connect_timeout_s={connect_timeout_s}: both must be > 0"
            )
        if default_max_tokens is not None and default_max_tokens < 1:
            raise ReplayError(f"default_max_tokens={default_max_tokens}: must be at least 1 (or unset)")
        clash = sorted(RESERVED_BODY_KEYS & set(extra_body or {}))
        if clash:
            raise ReplayError(
                f"extra_body may not set {', '.join(clash)}: the client sets these itself "
                "(use the model, max_tokens and ignore_eos settings instead)"
            )
        self.base_url = normalize_base_url(base_url)
        self.model = model or None
        self.api: Api = api
        self.api_key = api_key
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.ignore_eos = ignore_eos
        self.default_max_tokens = default_max_tokens
        self.extra_body = dict(extra_body or {})
        self._transport = transport
        self._wire: httpx.AsyncBaseTransport | None = None
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> StreamingClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        t = self.request_timeout_s
        self._wire = self._transport or LoadTransport(max_connections=self.max_connections)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            # read: the longest silence inside a stream (a long prefill under load); pool: the
            # wait for a free connection when more requests than connections are in flight.
            timeout=httpx.Timeout(connect=self.connect_timeout_s, read=t, write=t, pool=t),
            transport=self._wire,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("StreamingClient is not open: use it as `async with StreamingClient(...) as client`")
        return self._client

    # --- requests ---------------------------------------------------------------------------

    def build_payload(self, request: CorpusRequestLike) -> tuple[str, dict[str, Any]]:
        """The endpoint path and JSON body for one corpus request."""
        payload: dict[str, Any] = dict(self.extra_body)
        if self.model:
            payload["model"] = self.model
        if request.messages is not None:
            path = CHAT_PATH
            payload["messages"] = request.messages
        elif self.api == "chat":
            path = CHAT_PATH
            payload["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            path = COMPLETIONS_PATH
            payload["prompt"] = request.prompt
        max_tokens = request.max_tokens if request.max_tokens is not None else self.default_max_tokens
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
            if self.ignore_eos:
                payload["ignore_eos"] = True
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
        return path, payload

    async def send(self, request: CorpusRequestLike, *, scheduled_s: float | None = None) -> RequestRecord:
        """Stream one request; failures are recorded in the record, never raised (but cancels are)."""
        path, payload = self.build_payload(request)
        rec = RequestRecord(request_id=str(request.id), send_s=time.perf_counter(), end_s=0.0, scheduled_s=scheduled_s)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._stream(path, payload, rec, chat=path == CHAT_PATH)
        except TimeoutError:
            _fail(rec, "timeout", f"no complete answer within request_timeout_s={self.request_timeout_s:g}")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            _fail(rec, "connect", f"cannot connect to {self.base_url}: {_exc_text(exc)}")
        except httpx.TimeoutException as exc:
            _fail(rec, "timeout", f"{type(exc).__name__}: {_exc_text(exc)}")
        except (httpx.TransportError, httpx.DecodingError) as exc:
            _fail(rec, "broken_stream", f"{type(exc).__name__}: {_exc_text(exc)}")
        return rec

    async def _stream(self, path: str, payload: dict[str, Any], rec: RequestRecord, *, chat: bool) -> None:
        req = self.http.build_request("POST", path, json=payload)
        perf_counter = time.perf_counter
        rec.send_s = perf_counter()
        # Straight to the transport: the client layer's auth flow, redirect loop, cookie jar and
        # stream wrappers cost more per request than parsing the stream, and a load test wants
        # none of them (a redirect shows up as http_3xx, which is what it is).
        resp = await self._wire.handle_async_request(req)  # type: ignore[union-attr]
        encoding = resp.headers.get("content-encoding")
        chunks = resp.stream if not encoding or encoding == "identity" else resp.aiter_bytes()
        try:
            if resp.status_code != 200:
                body = b""
                async for part in chunks:  # type: ignore[union-attr]
                    body += part
                    if len(body) >= ERROR_BODY_MAX_BYTES:
                        break
                _fail(rec, f"http_{resp.status_code}", _error_message(body[:ERROR_BODY_MAX_BYTES]))
                return
            parser = SSEParser()
            loads = json.loads
            token_times = rec.token_times_s
            usage: dict[str, Any] | None = None
            done_s: float | None = None
            async for raw in chunks:  # type: ignore[union-attr]
                now = perf_counter()
                for data in parser.feed(raw):
                    if data == DONE:
                        done_s = now
                        continue
                    if rec.error is not None:
                        continue  # after an error event, only read on to [DONE] to keep the connection
                    try:
                        obj = loads(data)
                    except ValueError:
                        _fail(rec, "broken_stream", f"chunk is not JSON: {_short(data)}")
                        return
                    if not isinstance(obj, dict):
                        _fail(rec, "broken_stream", f"chunk is not a JSON object: {_short(data)}")
                        return
                    err = obj.get("error")
                    if err is not None or obj.get("object") == "error":
                        _fail(rec, "server_error", _error_message(data.encode()))
                        continue
                    choices = obj.get("choices")
                    if choices:
                        choice = choices[0]
                        if chat:
                            delta = choice.get("delta")
                            # Reasoning models stream their thinking first; it is output the user
                            # waits through, so it counts as tokens.
                            content = (
                                delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                                if delta
                                else None
                            )
                        else:
                            content = choice.get("text")
                        if content:
                            token_times.append(now)
                    u = obj.get("usage")
                    if u:
                        usage = u
            if rec.error is not None:
                return
            if done_s is None:
                _fail(rec, "broken_stream", "the stream ended without data: [DONE]")
                return
            rec.end_s = done_s
        finally:
            await resp.aclose()
        if token_times:
            rec.first_token_s = token_times[0]
        if usage is not None and isinstance(usage.get("completion_tokens"), int):
            rec.prompt_tokens = usage.get("prompt_tokens")
            rec.completion_tokens = usage["completion_tokens"]
            rec.tokens_source = "usage"
        else:
            rec.completion_tokens = len(token_times)
            rec.prompt_tokens = None
            rec.tokens_source = "chunks"

    # --- server API -------------------------------------------------------------------------

    async def _call(self, method: str, path: str, json_body: dict[str, Any] | None = None) -> httpx.Response:
        """One API call; raises ServerUnreachable / AuthError for what makes the server unusable."""
        url = f"{self.base_url}{path}"
        try:
            resp = await self.http.request(method, path, json=json_body)
        except httpx.TransportError as exc:
            raise ServerUnreachable(
                f"nothing answers at {url} ({type(exc).__name__}: {_exc_text(exc)}); "
                "check that the server is running and the URL (scheme, host, port) is right"
            ) from None
        if resp.status_code in (401, 403):
            hint = (
                "no API key was given: pass the key the server was started with (vLLM --api-key / VLLM_API_KEY)"
                if not self.api_key
                else "check that it matches the server's --api-key / VLLM_API_KEY"
            )
            raise AuthError(f"the server rejected the API key (HTTP {resp.status_code} from {url}); {hint}")
        return resp

    def _json(self, resp: httpx.Response, what: str) -> Any:
        if resp.status_code != 200:
            raise ServerError(f"{what} at {resp.request.url} answered HTTP {resp.status_code}: {_error_message(resp.content)}")
        try:
            return resp.json()
        except ValueError:
            raise ServerError(f"{what} at {resp.request.url} did not answer JSON: {_short(resp.text)}") from None

    async def list_models(self) -> list[dict[str, Any]]:
        """GET /v1/models: each entry has "id" and, from vLLM, "max_model_len"."""
        body = self._json(await self._call("GET", "/v1/models"), "the model list")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise ServerError(f"{self.base_url}/v1/models did not answer an OpenAI model list: {_short(str(body))}")
        return data

    async def check(self) -> str:
        """Make sure the server answers and serves the model; returns the model id to use.

        Without a model, picks the first one served (and sends it from then on).
        """
        served = [m["id"] for m in await self.list_models()]
        if not self.model:
            if not served:
                raise ServerError(f"{self.base_url}/v1/models lists no model")
            self.model = served[0]
        elif self.model not in served:
            raise ModelNotServed(self.model, served)
        return self.model

    async def tokenize(self, request: CorpusRequestLike) -> int:
        """The prompt's token count by the server's own tokenizer (vLLM's POST /tokenize)."""
        body: dict[str, Any] = {"model": self.model} if self.model else {}
        if request.messages is not None:
            body["messages"] = request.messages
        elif self.api == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        resp = await self._call("POST", "/tokenize", body)
        if resp.status_code == 404:
            raise ServerError(f"{self.base_url} has no /tokenize endpoint (it is not vLLM?); cannot count tokens")
        result = self._json(resp, f"tokenizing request {request.id!r}")
        count = result.get("count") if isinstance(result, dict) else None
        if not isinstance(count, int):
            raise ServerError(f"{self.base_url}/tokenize answered no integer 'count': {_short(str(result))}")
        return count

    async def metrics_text(self) -> str | None:
        """GET /metrics as Prometheus text; None when the server has none or cannot be reached."""
        try:
            resp = await self.http.get("/metrics")
        except httpx.TransportError:
            return None
        return resp.text if resp.status_code == 200 else None

    async def version(self) -> str | None:
        """The server's version from GET /version (vLLM has it); None when it does not say."""
        try:
            resp = await self.http.get("/version")
        except httpx.TransportError:
            return None
        if resp.status_code != 200:
            return None
        try:
            version = resp.json().get("version")
        except (ValueError, AttributeError):
            return None
        return version if isinstance(version, str) else None


def _fail(rec: RequestRecord, kind: str, detail: str) -> None:
    # The first failure is the cause; later ones (a drop after an error event) only follow it.
    if rec.error is None:
        rec.error = kind
        rec.error_detail = _short(detail)
    rec.end_s = time.perf_counter()


def _exc_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


# --- transport ------------------------------------------------------------------------------


class LoadTransport(httpx.AsyncBaseTransport):
    """A lean HTTP/1.1 transport for many concurrent streams to one server.

    Why not httpx's default (httpcore): its pool scans every connection for every request and
    polls each socket to see whether it expired, so its cost grows with the square of the
    concurrency; at 256 streams on two cores the client, not the server, set the pace (measured
    with benchmarks/client_overhead.py). This one keeps idle connections on a stack, hands a
    released connection straight to the longest waiter, and reads chunked bodies chunk by chunk,
    which for SSE is one event per chunk.

    It honours httpx's timeout extension (connect, read, write, pool) and raises httpx's
    exceptions, so StreamingClient maps its failures as it would httpcore's.
    """

    def __init__(self, *, max_connections: int) -> None:
        self._max_connections = max_connections
        self._open = 0
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()
        self._all: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    @property
    def max_connections(self) -> int:
        return self._max_connections

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        https = url.scheme == "https"
        key = (url.scheme, url.host, url.port or (443 if https else 80))
        body = await request.aread()
        head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path)]
        head += [b"%s: %s\r\n" % (k, v) for k, v in request.headers.raw]
        message = b"".join(head) + b"\r\n" + body
        read_timeout = timeouts.get("read")
        for attempt in range(2):
            conn, reused = await self._acquire(key, timeouts)
            try:
                conn.writer.write(message)
                if conn.writer.transport.get_write_buffer_size():
                    async with asyncio.timeout(timeouts.get("write")):
                        await conn.writer.drain()
                status, reason, headers, version = await conn.read_head(read_timeout)
            except _StaleConnection:
                self._discard(conn)
                # A kept-alive connection the server had closed: nothing was processed, try a fresh one.
                if reused and attempt == 0:
                    continue
                raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request)
            except TimeoutError:
                self._discard(conn)
                raise httpx.WriteTimeout("timed out sending the request", request=request) from None
            except ConnectionError as exc:
                self._discard(conn)
                if reused and attempt == 0:
                    continue
                raise httpx.WriteError(f"connection lost sending the request: {exc}", request=request) from None
            except BaseException:
                self._discard(conn)
                raise
            break
        stream = _ResponseStream(self, conn, request.method, status, headers, version, read_timeout)
        return httpx.Response(
            status, headers=headers, stream=stream, extensions={"http_version": version, "reason_phrase": reason}
        )

    async def _acquire(self, key: tuple[str, str, int], timeouts: dict[str, float | None]) -> tuple[_Connection, bool]:
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.usable():
                    return conn, True
                self._discard(conn)
            if self._open < self._max_connections:
                self._open += 1
                try:
                    conn = await self._connect(key, timeouts.get("connect"))
                except BaseException:
                    self._open -= 1
                    self._wake_one(None)
                    raise
                self._all.add(conn)
                return conn, False
            fut: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    handed = await fut
            except BaseException as exc:
                if fut.done() and not fut.cancelled() and fut.result() is not None:
                    self._release(fut.result())  # handed over just as the wait ended: pass it on
                elif not fut.done():
                    fut.cancel()
                if isinstance(exc, TimeoutError):
                    raise httpx.PoolTimeout(
                        f"no free connection within the pool timeout ({self._max_connections} connections busy)"
                    ) from None
                raise
            if handed is not None:
                return handed, True
            # None: a connection closed, so there is room to open a new one; go round again.

    async def _connect(self, key: tuple[str, str, int], timeout_s: float | None) -> _Connection:
        scheme, host, port = key
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=1 << 20)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect timeout after {timeout_s:g} s") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        return _Connection(key, reader, writer)

    def _wake_one(self, conn: _Connection | None) -> bool:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(conn)
                return True
        return False

    def _release(self, conn: _Connection) -> None:
        if not conn.usable():
            self._discard(conn)
        elif not self._wake_one(conn):
            self._idle.setdefault(conn.key, []).append(conn)

    def _discard(self, conn: _Connection) -> None:
        if conn in self._all:
            self._all.discard(conn)
            self._open -= 1
            conn.writer.transport.abort()
            self._wake_one(None)

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.writer.transport.abort()
        self._all.clear()
        self._idle.clear()
        self._open = 0


class _StaleConnection(Exception):
    """The server closed the connection before sending a single byte of the response."""


class _Connection:
    __slots__ = ("key", "reader", "writer")

    def __init__(self, key: tuple[str, str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        # Both are kept current by the event loop's callbacks: no system call here.
        return not self.writer.transport.is_closing() and not self.reader.at_eof()

    async def read_head(self, timeout_s: float | None) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        while True:
            try:
                async with asyncio.timeout(timeout_s):
                    data = await self.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _StaleConnection from None
                raise httpx.RemoteProtocolError("server closed the connection inside the response head") from None
            except asyncio.LimitOverrunError:
                raise httpx.RemoteProtocolError("response head larger than 1 MiB") from None
            except TimeoutError:
                raise httpx.ReadTimeout(f"no response within the read timeout ({timeout_s:g} s)") from None
            except ConnectionError as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from None
            lines = data[:-4].split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            try:
                version, status = parts[0], int(parts[1])
            except (IndexError, ValueError):
                raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}") from None
            if 100 <= status < 200:
                continue  # interim response (100 Continue): the real one follows
            headers = []
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep:
                    raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}")
                headers.append((name.strip(), value.strip()))
            return status, parts[2] if len(parts) > 2 else b"", headers, version


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(
        self,
        transport: LoadTransport,
        conn: _Connection,
        method: str,
        status: int,
        headers: list[tuple[bytes, bytes]],
        version: bytes,
        read_timeout_s: float | None,
    ) -> None:
        self._transport = transport
        self._conn = conn
        self._timeout_s = read_timeout_s
        self._complete = False
        self._closed = False
        self._watchdog: asyncio.TimerHandle | None = None
        self._reading = False
        names = {k.lower(): v for k, v in headers}
        connection = names.get(b"connection", b"").lower()
        self._keep_alive = version == b"HTTP/1.1" and b"close" not in connection
        self._chunked = b"chunked" in names.get(b"transfer-encoding", b"").lower()
        length = names.get(b"content-length")
        if method == "HEAD" or status in (204, 304):
            self._length: int | None = 0
        elif self._chunked:
            self._length = None
        elif length is not None:
            try:
                self._length = int(length)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad content-length {length!r}") from None
        else:
            self._length = None
            self._keep_alive = False  # the body ends when the server closes the connection

    # The read timeout is a watchdog per response, not a timer per read: at a thousand streams
    # a timer per SSE event filled the loop's heap and cost a quarter of the client's time.
    # Each read only notes when it started; the watchdog wakes about once per timeout period and
    # cancels the reading task when one read has waited a whole period.

    def _arm(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._cancelling = self._task.cancelling() if self._task is not None else 0
        self._last_s = self._loop.time()
        self._fired = False
        if self._timeout_s is not None and self._task is not None:
            self._watchdog = self._loop.call_at(self._last_s + self._timeout_s, self._check)

    def _check(self) -> None:
        assert self._timeout_s is not None and self._task is not None
        due = self._last_s + self._timeout_s
        now = self._loop.time()
        if not self._reading:
            # The consumer is busy between reads: only silence while reading counts.
            self._watchdog = self._loop.call_at(now + self._timeout_s, self._check)
        elif now >= due:
            self._fired = True
            self._watchdog = None
            self._task.cancel()
        else:
            self._watchdog = self._loop.call_at(due, self._check)

    def _disarm(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    async def _read(self, coro: Any) -> bytes:
        self._reading = True
        self._last_s = self._loop.time()
        try:
            data = await coro
        except asyncio.CancelledError:
            if self._fired and self._task is not None and self._task.uncancel() <= self._cancelling:
                self._fired = False
                raise httpx.ReadTimeout(f"nothing received for the read timeout ({self._timeout_s:g} s)") from None
            raise
        except asyncio.IncompleteReadError:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body") from None
        except asyncio.LimitOverrunError:
            raise httpx.RemoteProtocolError("chunk size line too long") from None
        except ConnectionError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from None
        finally:
            self._reading = False
        return data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._arm()
        reader = self._conn.reader
        read = self._read
        try:
            if self._chunked:
                while True:
                    line = await read(reader.readuntil(b"\r\n"))
                    try:
                        size = int(line.split(b";", 1)[0], 16)
                    except ValueError:
                        raise httpx.RemoteProtocolError(f"bad chunk size line {line[:40]!r}") from None
                    if size == 0:
                        while await read(reader.readuntil(b"\r\n")) != b"\r\n":
                            pass  # trailer fields
                        break
                    data = await read(reader.readexactly(size + 2))
                    if data[-2:] != b"\r\n":
                        raise httpx.RemoteProtocolError("chunk not followed by CRLF")
                    yield data[:-2]
            elif self._length is not None:
                remaining = self._length
                while remaining > 0:
                    data = await read(reader.read(min(remaining, 1 << 16)))
                    if not data:
                        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
                    remaining -= len(data)
                    yield data
            else:
                while data := await read(reader.read(1 << 16)):
                    yield data
            self._complete = True
        finally:
            self._disarm()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._disarm()
        if self._complete and self._keep_alive:
            self._transport._release(self._conn)
        else:
            self._transport._discard(self._conn)
