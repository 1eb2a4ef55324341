"""vLLM's own histograms read over a replay step against real vLLM (the CPU build, tiny model).

The shared server is reused: one short step at concurrency 4 with 32-token outputs, whose
window's server figures must be there and agree with what the client counted.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from replay.corpus.jsonl import load_corpus
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings

pytestmark = pytest.mark.e2e


def _corpus(path: Path) -> Path:
    with path.open("w") as out:
        for i in range(100):
            out.write(json.dumps({"prompt": f"Request {i}: a short note about the weather.", "max_tokens": 32}) + "\n")
    return path


@pytest.mark.timeout(600)
def test_a_step_carries_vllms_own_figures_that_agree_with_the_client(shared_server, tmp_path: Path) -> None:
    settings = ReplaySettings(
        concurrency=[4], warmup_requests=4, min_requests=24, metrics_interval_s=0.25, request_timeout_s=300
    )
    # A client p50, not a p99: 24 requests bound a median from both sides, while a p99 would stay
    # inconclusive (and count against the step) however far below its bound the latency is.
    slo = {"ttft_p50_ms": 60000, "server_ttft_p99_ms": 60000, "server_tpot_p99_ms": 60000}
    corpus = load_corpus(_corpus(tmp_path / "corpus.jsonl"))
    results = asyncio.run(run_replay(url=shared_server.url, corpus=corpus, settings=settings, slo=slo))
    (step,) = results.steps
    server, client = step.server, step.client
    assert server.histograms_note is None and not server.counter_reset, server.histograms_note
    assert server.ttft_ms is not None and server.ttft_ms.count > 0 and server.ttft_ms.mean > 0
    assert server.ttft_ms.p99 is not None and server.ttft_ms.p99_bucket_ms is not None
    assert server.tpot_ms is not None and server.tpot_ms.count > 0 and server.tpot_ms.mean > 0
    assert all(getattr(server, f"{k}_ms") is not None for k in ("itl", "e2e", "queue", "prefill", "decode"))
    # Every request generates 32 tokens (ignore_eos): the generation counter says so too.
    assert server.generation_tokens is not None and server.generation_tokens > 0
    # What the server finished in the window is what the client counted, but for requests at the
    # window's edges: those still running at its close (drained) bound the difference.
    assert step.requests_drained > 0
    assert abs(client.requests_minus_server) <= step.requests_drained, (client, server.requests_finished)
    # The client waits for the server's first token, then for the network and its own parsing.
    assert step.ttft_ms.mean >= server.ttft_ms.mean, (step.ttft_ms, server.ttft_ms)
    assert step.slo_views == {"ttft_p50_ms": "client", "server_ttft_p99_ms": "server", "server_tpot_p99_ms": "server"}
    assert step.slo_pass, step.slo_violations
    print(
        f"client TTFT mean {step.ttft_ms.mean:.1f} ms, server {server.ttft_ms.mean:.1f} ms; "
        f"client TPOT mean {step.tpot_ms.mean:.2f} ms, server {server.tpot_ms.mean:.2f} ms; "
        f"finished client {client.requests_finished} / server {server.requests_finished:g}, "
        f"drained {step.requests_drained}; bursts {client.itl_bursts}"
    )
