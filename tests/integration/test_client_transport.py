"""LoadTransport on its own, through a plain httpx.AsyncClient: timeouts, framing, pool bounds."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from replay.client.transport import LoadTransport
from tests.fakes.openai_server import Behavior, FakeServer

BODY = {"model": "fake-model", "prompt": "hi", "max_tokens": 10, "stream": True}


async def _stream_once(srv: FakeServer, read_timeout_s: float, **kwargs) -> list[bytes]:
    timeout = httpx.Timeout(5.0, read=read_timeout_s)
    async with httpx.AsyncClient(base_url=srv.url, transport=LoadTransport(max_connections=2), timeout=timeout) as c:
        async with c.stream("POST", "/v1/completions", json=BODY) as resp:
            return [chunk async for chunk in resp.aiter_raw()]


def test_read_timeout_counts_silence_not_total_time() -> None:
    async def main() -> tuple[list[bytes], type[BaseException] | None]:
        async with FakeServer(Behavior(itl_s=0.1)) as srv:
            # 10 tokens 100 ms apart: a second in all, but never half a second of silence (a
            # wide margin, for a busy test machine).
            chunks = await _stream_once(srv, 0.5)
            srv.behavior = Behavior(itl_s=2.0)
            try:
                await _stream_once(srv, 0.5)
            except httpx.HTTPError as exc:
                return chunks, type(exc)
            return chunks, None

    chunks, error = asyncio.run(main())
    assert chunks[-1] == b"data: [DONE]\n\n" and len(chunks) == 11
    assert error is httpx.ReadTimeout


def test_content_length_bodies_and_keep_alive() -> None:
    async def main() -> tuple[list[int], int]:
        async with FakeServer(Behavior()) as srv:
            async with httpx.AsyncClient(base_url=srv.url, transport=LoadTransport(max_connections=4)) as c:
                codes = [(await c.get("/v1/models")).status_code for _ in range(5)]
                codes.append((await c.get("/nope")).status_code)
                return codes, srv.stats.connections

    codes, connections = asyncio.run(main())
    assert codes == [200] * 5 + [404] and connections == 1


def test_connect_errors_are_httpx_errors(closed_port: int) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(transport=LoadTransport(max_connections=1)) as c:
            await c.get(f"http://127.0.0.1:{closed_port}/health")

    with pytest.raises(httpx.ConnectError, match="on each of 3 attempts"):
        asyncio.run(main())


def test_a_refused_connect_is_tried_again_and_the_response_says_so(closed_port: int) -> None:
    """The server starts listening between the first refused connect and the retry 0.5 s later:
    the request succeeds on that retry, and only the request that opened the connection counts it."""

    async def main() -> tuple[list[int], list[int], float]:
        async def listen_late() -> FakeServer:
            await asyncio.sleep(0.2)
            return await FakeServer(Behavior(), port=closed_port).__aenter__()

        late = asyncio.create_task(listen_late())
        url = f"http://127.0.0.1:{closed_port}/v1/models"
        async with httpx.AsyncClient(transport=LoadTransport(max_connections=1)) as c:
            t0 = asyncio.get_running_loop().time()
            first = await c.get(url)
            waited = asyncio.get_running_loop().time() - t0
            second = await c.get(url)
        srv = await late
        await srv.__aexit__(None, None, None)
        codes = [first.status_code, second.status_code]
        return codes, [first.extensions["connect_retries"], second.extensions["connect_retries"]], waited

    codes, retries, waited = asyncio.run(main())
    assert codes == [200, 200]
    assert retries == [1, 0]  # the second request reused the connection
    assert waited >= 0.5  # the backoff before the retry


def test_no_retries_when_asked_for_none(closed_port: int) -> None:
    async def main() -> float:
        t0 = asyncio.get_running_loop().time()
        with contextlib.suppress(httpx.ConnectError):
            async with httpx.AsyncClient(transport=LoadTransport(max_connections=1, connect_retries=0)) as c:
                await c.get(f"http://127.0.0.1:{closed_port}/health")
            raise AssertionError("the connect to a closed port succeeded")
        return asyncio.get_running_loop().time() - t0

    assert asyncio.run(main()) < 0.5  # refused at once, no backoff
    with pytest.raises(ValueError, match="connect_retries=-1"):
        LoadTransport(max_connections=1, connect_retries=-1)


def test_pool_timeout_when_every_connection_is_busy() -> None:
    async def main() -> type[BaseException] | None:
        async with FakeServer(Behavior(ttft_s=0.5)) as srv:
            timeout = httpx.Timeout(5.0, pool=0.05)
            async with httpx.AsyncClient(base_url=srv.url, transport=LoadTransport(max_connections=1), timeout=timeout) as c:
                slow = asyncio.create_task(c.post("/v1/completions", json=BODY))
                await asyncio.sleep(0.05)
                try:
                    await c.get("/health")
                except httpx.PoolTimeout as exc:
                    return type(exc)
                finally:
                    await slow
        return None

    assert asyncio.run(main()) is httpx.PoolTimeout


def test_server_closing_mid_stream_is_a_protocol_error() -> None:
    async def main() -> None:
        async with FakeServer(Behavior(disconnect_rate=1.0)) as srv:
            await _stream_once(srv, 5.0)

    with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
        asyncio.run(main())


def test_a_request_outlives_every_idle_connection_the_server_dropped_at_once() -> None:
    """vLLM's server (uvicorn) closes idle kept-alive connections after 5 s, all together after a
    pause in the load; a request that meets one closed under it must go on to the next, and to a
    fresh one, not fail (a fresh-clone CI run saw one such 'error' fail an SLO step)."""

    async def main() -> tuple[list[int], list[int]]:
        answered: list[int] = []
        writers: list[asyncio.StreamWriter] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            # Each connection answers one request; a second one on it finds the connection given
            # up: closed without a byte, as a keep-alive time-out does in the race with a reuse.
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await reader.readuntil(b"\r\n\r\n")
                answered.append(len(answered))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, httpx.AsyncClient(transport=LoadTransport(max_connections=4)) as c:
            url = f"http://127.0.0.1:{port}/x"
            # Three connections opened together, then idle in the pool.
            first = await asyncio.gather(*(c.get(url) for _ in range(3)))
            later = await c.get(url)
        for writer in writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        return [r.status_code for r in first], [later.status_code, len(answered)]

    first, (later, answered) = asyncio.run(main())
    assert first == [200, 200, 200]
    assert later == 200 and answered == 4, "three dropped connections tried, then a fresh one answered"
