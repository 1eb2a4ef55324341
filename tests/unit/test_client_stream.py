"""StreamingClient against httpx.MockTransport: payloads, chunk timing rules, error kinds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from replay.client.streaming import StreamingClient, normalize_base_url
from replay.errors import AuthError, ModelNotServed, ReplayError, ServerError, ServerUnreachable


@dataclass
class Req:
    """The fields of replay.corpus.jsonl.CorpusRequest the client reads."""

    id: str = "r1"
    prompt: str | None = "hello"
    messages: list[dict] | None = None
    max_tokens: int | None = None
    index: int = 0
    line: int = 1
    timestamp_s: float | None = None
    extra: dict = field(default_factory=dict)


def sse(*objs: object, done: bool = True) -> list[bytes]:
    parts = [f"data: {json.dumps(o)}\n\n".encode() for o in objs]
    return parts + ([b"data: [DONE]\n\n"] if done else [])


def text_chunk(text: str) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}


def chat_chunk(**delta: str) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}}


async def _gen(parts: list[bytes], delay_s: float) -> AsyncIterator[bytes]:
    for p in parts:
        if delay_s:
            await asyncio.sleep(delay_s)
        yield p


def run(
    parts_or_handler: list[bytes] | Callable[[httpx.Request], httpx.Response],
    request: Req | None = None,
    *,
    delay_s: float = 0.0,
    seen: list[httpx.Request] | None = None,
    **kwargs,
):
    def handler(req: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(req)
        if callable(parts_or_handler):
            return parts_or_handler(req)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_gen(parts_or_handler, delay_s))

    async def main():
        kwargs.setdefault("model", "m")
        async with StreamingClient("http://127.0.0.1:1", transport=httpx.MockTransport(handler), **kwargs) as c:
            return await c.send(request or Req())

    return asyncio.run(main())


def test_completions_payload_has_stream_usage_max_tokens_and_ignore_eos() -> None:
    seen: list[httpx.Request] = []
    run(sse(text_chunk("a"), USAGE), Req(max_tokens=7), seen=seen, api_key="k", extra_body={"temperature": 0})
    req = seen[0]
    assert req.url.path == "/v1/completions"
    assert req.headers["authorization"] == "Bearer k"
    assert json.loads(req.content) == {
        "temperature": 0,
        "model": "m",
        "prompt": "hello",
        "max_tokens": 7,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_payload_without_max_tokens_omits_it_and_ignore_eos() -> None:
    c = StreamingClient("http://h:1", model="m")
    _, body = c.build_payload(Req())
    assert "max_tokens" not in body and "ignore_eos" not in body
    _, body = StreamingClient("http://h:1", model="m", default_max_tokens=32).build_payload(Req())
    assert body["max_tokens"] == 32 and body["ignore_eos"] is True
    _, body = StreamingClient("http://h:1", model="m", default_max_tokens=32, ignore_eos=False).build_payload(Req(max_tokens=5))
    assert body["max_tokens"] == 5 and "ignore_eos" not in body
    _, body = StreamingClient("http://h:1", model=None).build_payload(Req())
    assert "model" not in body


def test_chat_payloads() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    path, body = StreamingClient("http://h:1", model="m").build_payload(Req(prompt=None, messages=msgs))
    assert path == "/v1/chat/completions" and body["messages"] == msgs and "prompt" not in body
    path, body = StreamingClient("http://h:1", model="m", api="chat").build_payload(Req(prompt="p"))
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "p"}]


def test_extra_body_may_not_override_what_the_client_sets() -> None:
    with pytest.raises(ReplayError, match="stream"):
        StreamingClient("http://h:1", model="m", extra_body={"stream": False})


def test_bad_urls_and_v1_suffix() -> None:
    assert normalize_base_url("http://h:8000/v1/") == "http://h:8000"
    with pytest.raises(ReplayError, match="http://HOST:PORT"):
        normalize_base_url("h:8000")


def test_usage_chunk_gives_token_counts() -> None:
    rec = run(sse(text_chunk("a"), text_chunk(""), text_chunk("b"), USAGE))
    assert rec.ok and rec.tokens_source == "usage"
    assert (rec.prompt_tokens, rec.completion_tokens) == (11, 3)
    # The empty chunk is not a token arrival.
    assert len(rec.token_times_s) == 2
    assert rec.first_token_s == rec.token_times_s[0]
    assert rec.send_s <= rec.first_token_s <= rec.end_s


def test_without_usage_tokens_are_counted_as_content_chunks() -> None:
    rec = run(sse(text_chunk("a"), text_chunk("b"), text_chunk("c")))
    assert rec.ok and rec.tokens_source == "chunks"
    assert (rec.prompt_tokens, rec.completion_tokens) == (None, 3)


def test_chat_role_delta_is_not_the_first_token() -> None:
    parts = sse(chat_chunk(role="assistant", content=""), chat_chunk(content="x"), chat_chunk(content="y"), USAGE)
    rec = run(parts, Req(prompt=None, messages=[{"role": "user", "content": "q"}]), delay_s=0.02)
    assert rec.ok and len(rec.token_times_s) == 2
    # The role delta arrived ~20 ms before the first content: TTFT must not be measured from it.
    assert rec.ttft_s is not None and rec.ttft_s >= 0.035


def test_reasoning_content_counts_as_output() -> None:
    parts = sse(chat_chunk(role="assistant"), chat_chunk(reasoning_content="think"), chat_chunk(content="x"))
    rec = run(parts, api="chat")
    assert rec.ok and len(rec.token_times_s) == 2


def test_error_event_in_a_200_stream_is_server_error() -> None:
    err = {"error": {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}}
    rec = run(sse(text_chunk("a"), err))
    assert rec.error == "server_error" and rec.error_detail == "engine died"


@pytest.mark.parametrize(
    ("parts", "detail"),
    [
        (sse(text_chunk("a"), done=False), "without data: [DONE]"),
        ([b"data: {not json\n\n", b"data: [DONE]\n\n"], "not JSON"),
        ([b"data: [1, 2]\n\n", b"data: [DONE]\n\n"], "not a JSON object"),
    ],
)
def test_broken_streams(parts: list[bytes], detail: str) -> None:
    rec = run(parts)
    assert rec.error == "broken_stream" and detail in (rec.error_detail or "")


def test_http_status_is_recorded_with_the_servers_message() -> None:
    body = {"error": {"message": "This model's maximum context length is 4096 tokens.", "code": 400}}
    rec = run(lambda req: httpx.Response(400, json=body))
    assert rec.error == "http_400" and "maximum context length" in (rec.error_detail or "")


def test_transport_errors_map_to_kinds() -> None:
    def raiser(exc: Exception):
        def handler(req: httpx.Request) -> httpx.Response:
            raise exc

        return handler

    assert run(raiser(httpx.ConnectError("refused"))).error == "connect"
    assert run(raiser(httpx.ReadTimeout("slow"))).error == "timeout"
    assert run(raiser(httpx.RemoteProtocolError("peer closed"))).error == "broken_stream"


def test_total_request_timeout() -> None:
    rec = run(sse(text_chunk("a"), text_chunk("b")), delay_s=0.2, request_timeout_s=0.05)
    assert rec.error == "timeout" and "request_timeout_s=0.05" in (rec.error_detail or "")


def test_cancel_is_not_swallowed() -> None:
    async def main() -> None:
        transport = httpx.MockTransport(
            lambda req: httpx.Response(200, content=_gen(sse(text_chunk("a")), 10.0))
        )
        async with StreamingClient("http://h:1", model="m", transport=transport) as c:
            task = asyncio.create_task(c.send(Req()))
            await asyncio.sleep(0.01)
            task.cancel()
            await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def api(handler: Callable[[httpx.Request], httpx.Response], coro: Callable, **kwargs):
    async def main():
        kwargs.setdefault("model", "m")
        async with StreamingClient("http://h:1", transport=httpx.MockTransport(handler), **kwargs) as c:
            return await coro(c), c

    return asyncio.run(main())


MODELS = {"object": "list", "data": [{"id": "a", "max_model_len": 2048}, {"id": "b"}]}


def test_check_picks_the_first_model_when_none_given() -> None:
    served, client = api(lambda req: httpx.Response(200, json=MODELS), lambda c: c.check(), model=None)
    assert served == "a" and client.model == "a"


def test_check_errors() -> None:
    with pytest.raises(ModelNotServed, match="served models: a, b"):
        api(lambda req: httpx.Response(200, json=MODELS), lambda c: c.check(), model="zzz")
    with pytest.raises(AuthError, match="rejected the API key.*no API key was given"):
        api(lambda req: httpx.Response(401, json={"error": "Unauthorized"}), lambda c: c.check())

    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(ServerUnreachable, match="nothing answers at http://h:1/v1/models"):
        api(refuse, lambda c: c.check())
    with pytest.raises(ServerError, match="HTTP 500"):
        api(lambda req: httpx.Response(500, text="oops"), lambda c: c.check())
    with pytest.raises(ServerError, match="not answer an OpenAI model list"):
        api(lambda req: httpx.Response(200, json={"data": "x"}), lambda c: c.check())


def test_tokenize_version_and_metrics() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        match req.url.path:
            case "/tokenize":
                body = json.loads(req.content)
                assert body["model"] == "m"
                return httpx.Response(200, json={"count": len(body.get("prompt", "")), "max_model_len": 10, "tokens": []})
            case "/version":
                return httpx.Response(200, json={"version": "0.32.0"})
            case _:
                return httpx.Response(404)

    async def calls(c: StreamingClient):
        return await c.tokenize(Req(prompt="abcd")), await c.version(), await c.metrics_text()

    (count, version, metrics), _ = api(handler, calls)
    assert (count, version, metrics) == (4, "0.32.0", None)
    with pytest.raises(ServerError, match="no /tokenize endpoint"):
        api(lambda req: httpx.Response(404), lambda c: c.tokenize(Req()))


def test_a_metrics_time_out_is_raised_not_taken_for_a_server_without_metrics() -> None:
    # The scrapers note the error; a None would read "the server has no /metrics endpoint".
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=req)

    with pytest.raises(httpx.ReadTimeout):
        api(handler, lambda c: c.metrics_text())
