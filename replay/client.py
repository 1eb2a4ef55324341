"""The streaming client: one request of the corpus in, one `RequestRecord` out.

One `httpx.AsyncClient` serves a whole run, configured for load testing rather than for httpx's
defaults: a pool as large as the concurrency (the default 100 connections would silently cap a
sweep) and timeouts sized to the longest generation (the default 5 s would fail every long one).
Its transport is `replay.transport.LoadTransport`, which holds up to `max_connections` connections, all
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
import json
import time
from typing import Any, Literal, Protocol

import httpx

from replay.errors import AuthError, ModelNotServed, ReplayError, ServerError, ServerUnreachable
from replay.records import RequestRecord
from replay.sse import DONE, SSEParser
from replay.transport import LoadTransport

Api = Literal["completions", "chat"]
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
# Keys the client sets itself; extra_body may not override them, because the measurement
# depends on them (streaming, the usage chunk) or a setting of its own already controls them.
RESERVED_BODY_KEYS = frozenset({"model", "prompt", "messages", "stream", "stream_options", "max_tokens", "ignore_eos"})
# How much of an error response body is read to explain an http_<status>.
ERROR_BODY_MAX_BYTES = 4096
DETAIL_MAX_CHARS = 200
# Spare connections beside the load's, so /metrics scrapes never wait for a request to finish.
METRICS_CONNECTIONS = 4
# A /metrics answer takes milliseconds; one that takes longer than this is given up and noted, and
# the next scrape goes out (the connect is tried again as any other, so at most about 3 x this).
METRICS_TIMEOUT_S = 5.0


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

    async def send(
        self, request: CorpusRequestLike, *, scheduled_s: float | None = None, keep_text: bool = False
    ) -> RequestRecord:
        """Stream one request; failures are recorded in the record, never raised (but cancels are).

        keep_text: keep the streamed reply's text in `output_text` (a session's history needs it)."""
        path, payload = self.build_payload(request)
        rec = RequestRecord(request_id=str(request.id), send_s=time.perf_counter(), end_s=0.0, scheduled_s=scheduled_s)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._stream(path, payload, rec, chat=path == CHAT_PATH, keep_text=keep_text)
        except TimeoutError:
            _fail(rec, "timeout", f"no complete answer within request_timeout_s={self.request_timeout_s:g}")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            _fail(rec, "connect", f"cannot connect to {self.base_url}: {_exc_text(exc)}")
        except httpx.TimeoutException as exc:
            _fail(rec, "timeout", f"{type(exc).__name__}: {_exc_text(exc)}")
        except (httpx.TransportError, httpx.DecodingError) as exc:
            _fail(rec, "broken_stream", f"{type(exc).__name__}: {_exc_text(exc)}")
        return rec

    async def _stream(
        self, path: str, payload: dict[str, Any], rec: RequestRecord, *, chat: bool, keep_text: bool = False
    ) -> None:
        req = self.http.build_request("POST", path, json=payload)
        perf_counter = time.perf_counter
        rec.send_s = perf_counter()
        # Straight to the transport: the client layer's auth flow, redirect loop, cookie jar and
        # stream wrappers cost more per request than parsing the stream, and a load test wants
        # none of them (a redirect shows up as http_3xx, which is what it is).
        resp = await self._wire.handle_async_request(req)  # type: ignore[union-attr]
        rec.connect_retries = resp.extensions.get("connect_retries", 0)
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
            texts: list[str] | None = [] if keep_text else None
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
                            if texts is not None:
                                # The reply as history: its content, not a reasoning model's thinking.
                                text = delta.get("content") if chat else content
                                if text:
                                    texts.append(text)
                    u = obj.get("usage")
                    if u:
                        usage = u
            if rec.error is not None:
                return
            if done_s is None:
                _fail(rec, "broken_stream", "the stream ended without data: [DONE]")
                return
            rec.end_s = done_s
            if texts is not None:
                rec.output_text = "".join(texts)
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
        result = await self._tokenize(request)
        count = result.get("count") if isinstance(result, dict) else None
        if not isinstance(count, int):
            raise ServerError(f"{self.base_url}/tokenize answered no integer 'count': {_short(str(result))}")
        return count

    async def token_ids(self, request: CorpusRequestLike) -> list[int]:
        """The prompt's token ids by the server's own tokenizer (chat template included)."""
        result = await self._tokenize(request)
        tokens = result.get("tokens") if isinstance(result, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ServerError(f"{self.base_url}/tokenize answered no list of integer 'tokens': {_short(str(result))}")
        return tokens

    async def _tokenize(self, request: CorpusRequestLike) -> Any:
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
        return self._json(resp, f"tokenizing request {request.id!r}")

    async def metrics_text(self, timeout_s: float = METRICS_TIMEOUT_S) -> str | None:
        """GET /metrics as Prometheus text; None when the server has none (any answer but 200).

        A transport error (a time-out on a saturated server, say) is raised, so that the scraper
        notes what failed instead of calling the server one without metrics. The time-out is the
        scrape's own, not the requests': a scrape stuck for a generation's length would leave a
        whole window without a sample."""
        resp = await self.http.get("/metrics", timeout=timeout_s)
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
