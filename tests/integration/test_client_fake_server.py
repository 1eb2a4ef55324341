"""The fake server itself: what other tests rely on (wire format, capacity model, process mode)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.fakes.openai_server import Behavior, FakeServer, count_text_tokens


def _events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def test_stream_has_vllm_chunk_shapes_with_usage_before_done() -> None:
    async def main() -> list[str]:
        async with FakeServer(Behavior()) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            body = {
                "model": "fake-model",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            r = await c.post("/v1/chat/completions", json=body)
            assert r.headers["content-type"].startswith("text/event-stream")
            return _events(r.text)

    events = asyncio.run(main())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"]["content"] for c in chunks[1:4]] == [" t0", " t1", " t2"]
    assert chunks[3]["choices"][0]["finish_reason"] == "length"
    assert chunks[4]["choices"] == []
    assert chunks[4]["usage"]["completion_tokens"] == 3
    assert chunks[4]["usage"]["prompt_tokens"] == count_text_tokens("hello") + 4


def test_max_num_seqs_makes_requests_wait_and_kv_pool_preempts() -> None:
    async def main(behavior: Behavior) -> FakeServer:
        async with FakeServer(behavior) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            async def one() -> int:
                r = await c.post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 20})
                return r.status_code

            assert await asyncio.gather(*[one() for _ in range(8)]) == [200] * 8
            return srv

    srv = asyncio.run(main(Behavior(itl_s=0.001, max_num_seqs=2)))
    assert srv.stats.peak_running == 2 and srv.stats.peak_waiting >= 1 and srv.stats.preemptions == 0
    # 8 requests of 10 prompt + 20 generated tokens cannot all fit in 64 KV tokens.
    srv = asyncio.run(main(Behavior(itl_s=0.001, kv_cache_tokens=64)))
    assert srv.stats.preemptions > 0 and srv.stats.peak_kv_usage == 1.0
    assert srv.stats.completed == 8 and srv.stats.running == 0 and srv.stats.kv_used_tokens == 0


def test_metrics_text_has_vllm_names_and_can_be_switched_off() -> None:
    async def main() -> tuple[str, int]:
        async with FakeServer(Behavior(kv_cache_tokens=8192)) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            text = (await c.get("/metrics")).text
            srv.behavior = Behavior(metrics=False)
            return text, (await c.get("/metrics")).status_code

    text, status_off = asyncio.run(main())
    for name in ("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
                 "vllm:num_preemptions_total{", 'kv_cache_size_tokens="8192"', 'num_gpu_blocks="512"'):
        assert name in text
    assert status_off == 404


def test_process_mode_serves_until_terminated(spawn_fake_server) -> None:
    url = spawn_fake_server("--model", "m1", "--model", "m2", "--max-model-len", "2048")
    models = httpx.get(f"{url}/v1/models").json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("m1", 2048), ("m2", 2048)]


def test_behavior_rejects_bad_rates() -> None:
    with pytest.raises(ValueError, match="error_rate"):
        Behavior(error_rate=1.5)


def test_step_factor_is_shared_within_a_burst_and_drawn_anew_after_idle() -> None:
    """step_sigma: requests in flight together share one factor; after an idle spell a new one."""

    async def burst(c: httpx.AsyncClient, srv: FakeServer) -> float:
        async def one() -> None:
            r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 200

        await asyncio.gather(*[one() for _ in range(4)])
        await asyncio.sleep(0.02)
        return srv._step_factor

    async def main() -> list[float]:
        behavior = Behavior(itl_s=0.001, step_sigma=0.5, step_idle_s=0.01, seed=3)
        async with FakeServer(behavior) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            return [await burst(c, srv) for _ in range(3)]

    factors = asyncio.run(main())
    assert len(set(factors)) == 3 and all(f > 0 for f in factors)


def test_preemption_rate_preempts_requests_and_counts_them() -> None:
    async def main(rate: float) -> FakeServer:
        async with FakeServer(Behavior(itl_s=0.001, preemption_rate=rate)) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for _ in range(5):
                r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            return srv

    # One running (itself) at rate 1: every request is preempted exactly once.
    srv = asyncio.run(main(1.0))
    assert srv.stats.preemptions == 5 and srv.stats.running == 0 and srv.stats.kv_used_tokens == 0
    assert asyncio.run(main(0.0)).stats.preemptions == 0
