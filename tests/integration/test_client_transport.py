"""LoadTransport on its own, through a plain httpx.AsyncClient: timeouts, framing, pool bounds."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from replay.transport import LoadTransport
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

    with pytest.raises(httpx.ConnectError):
        asyncio.run(main())


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
