"""A lean HTTP/1.1 transport for many concurrent streams to one server (see LoadTransport)."""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx

# httpx's `retries=` retries connects only, with a backoff of factor 0.5 s; so do these, after
# 0.5 s and 1 s. Two cover a client loop or a server that stalled past one connect time-out.
CONNECT_RETRIES = 2
CONNECT_BACKOFF_S = 0.5


class LoadTransport(httpx.AsyncBaseTransport):
    """A lean HTTP/1.1 transport for many concurrent streams to one server.

    Why not httpx's default (httpcore): its pool scans every connection for every request and
    polls each socket to see whether it expired, so its cost grows with the square of the
    concurrency; at 256 streams on two cores the client, not the server, set the pace (measured
    with benchmarks/client_overhead.py). This one keeps idle connections on a stack, hands a
    released connection straight to the longest waiter, and reads chunked bodies chunk by chunk,
    which for SSE is one event per chunk.

    It honours httpx's timeout extension (connect, read, write, pool) and raises httpx's
    exceptions, so StreamingClient maps its failures as it would httpcore's. A failed connect is
    tried again `connect_retries` times, as httpx's own `retries=` does: a refused or timed-out
    handshake sent nothing, so trying again cannot send a request twice. The response's
    `connect_retries` extension says how many retries its connection took, so a step can report
    them rather than hide them.
    """

    def __init__(self, *, max_connections: int, connect_retries: int = CONNECT_RETRIES) -> None:
        if connect_retries < 0:
            raise ValueError(f"connect_retries={connect_retries}: must be 0 or more")
        self._max_connections = max_connections
        self._connect_retries = connect_retries
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
        # A server closes idle kept-alive connections together (uvicorn after 5 s), so the next one
        # from the pool may be stale too: each is tried and dropped, down to a fresh connection at
        # the latest, whose failure is the request's.
        for _ in range(self._max_connections + 1):
            conn, reused = await self._acquire(key, timeouts)
            try:
                conn.writer.write(message)
                if conn.writer.transport.get_write_buffer_size():
                    async with asyncio.timeout(timeouts.get("write")):
                        await conn.writer.drain()
                status, reason, headers, version = await conn.read_head(read_timeout)
            except _StaleConnection:
                self._discard(conn)
                # A kept-alive connection the server had closed: nothing was processed, try another.
                if reused:
                    continue
                raise httpx.RemoteProtocolError("server disconnected without sending a response", request=request)
            except TimeoutError:
                self._discard(conn)
                raise httpx.WriteTimeout("timed out sending the request", request=request) from None
            except ConnectionError as exc:
                self._discard(conn)
                if reused:
                    continue
                raise httpx.WriteError(f"connection lost sending the request: {exc}", request=request) from None
            except BaseException:
                self._discard(conn)
                raise
            break
        else:
            raise httpx.RemoteProtocolError(
                f"server disconnected without sending a response on {self._max_connections + 1} kept-alive connections",
                request=request,
            )
        try:
            stream = _ResponseStream(self, conn, request.method, status, headers, version, read_timeout)
        except BaseException:
            # A head the stream cannot frame (a bad Content-Length): the connection is unusable.
            self._discard(conn)
            raise
        extensions = {"http_version": version, "reason_phrase": reason, "connect_retries": conn.connect_retries}
        conn.connect_retries = 0  # counted once, for the request that opened the connection
        return httpx.Response(status, headers=headers, stream=stream, extensions=extensions)

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
                elif fut.done() and not fut.cancelled():
                    self._wake_one(None)  # handed room to connect just as the wait ended: pass it on
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
        retry = 0
        while True:
            try:
                conn = await self._connect_once(key, timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if retry == self._connect_retries:
                    if retry:
                        raise type(exc)(f"{exc} (on each of {retry + 1} attempts)") from None
                    raise
                retry += 1
                await asyncio.sleep(CONNECT_BACKOFF_S * 2 ** (retry - 1))
                continue
            conn.connect_retries = retry
            return conn

    async def _connect_once(self, key: tuple[str, str, int], timeout_s: float | None) -> _Connection:
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
    __slots__ = ("connect_retries", "key", "reader", "writer")

    def __init__(self, key: tuple[str, str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer
        self.connect_retries = 0

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
