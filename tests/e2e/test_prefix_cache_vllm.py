"""vLLM's prefix cache against the planner's model of it (the CPU build, the tiny model).

A corpus whose requests share a ~1,000-token system prompt, replayed at concurrency 8 on the
shared server (64 blocks of 128 tokens). Predictions come from the server's own /tokenize, as
`planner prompts stats --url` makes them:
- the window's hit rate (vllm:prefix_cache_hits / queries) is within 0.05 of the unbounded
  cache's rate over the corpus (every request but the first finds the shared blocks; the window
  holds only requests after the warm-up, so it reads slightly higher);
- the KV usage peak is within 0.15 of the prefix-aware prediction, (shared blocks + 8 x own
  blocks) / pool, and below the old one, 8 x whole blocks / pool (which exceeds the pool here).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from planner.vllm_log import cache_config_labels
from replay.corpus.jsonl import load_corpus
from replay.prefix.bound import prefix_aware_bound, request_blocks
from replay.prefix.corpus_stats import server_prompt_blocks
from replay.prefix.sharing import sharing
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings
from tests.e2e.support import CPU_BLOCK_SIZE

pytestmark = pytest.mark.e2e

CONCURRENCY, MAX_TOKENS = 8, 64
# Windows measured while their /metrics samples caught no request, or one, running (see the test).
MEASURE_ATTEMPTS = 3
HIT_RATE_TOLERANCE, KV_PEAK_TOLERANCE = 0.05, 0.15
WORDS = "the planner sizes a fleet of servers from measured latency and memory of each request in flight".split()


def _corpus(path: Path) -> Path:
    rng = random.Random(19)
    system = "System: " + " ".join(rng.choice(WORDS) for _ in range(400)) + "\n"
    with path.open("w") as out:
        for i in range(60):
            question = f"Question {i}: how many servers does a team of {rng.randint(2, 99)} people need?"
            out.write(json.dumps({"prompt": system + question, "max_tokens": MAX_TOKENS}) + "\n")
    return path


@pytest.mark.timeout(600)
def test_hit_rate_and_kv_peak_follow_the_prefix_model(shared_server, tmp_path: Path) -> None:
    corpus = load_corpus(_corpus(tmp_path / "corpus.jsonl"))
    prompts, _, metrics = asyncio.run(
        server_prompt_blocks(
            corpus, shared_server.url, model=None, api="completions", api_key=None, block_size=lambda _m: CPU_BLOCK_SIZE
        )
    )
    pool = int(cache_config_labels(metrics)["num_gpu_blocks"])
    predicted = sharing(prompts, CPU_BLOCK_SIZE, pool)
    blocks = [request_blocks(n, MAX_TOKENS, block_size=CPU_BLOCK_SIZE, max_model_len=None) for n, _ in prompts]
    _, own, shared = prefix_aware_bound(blocks, [h for _, h in prompts], pool_blocks=pool)
    prefix_usage = (shared + CONCURRENCY * own) / pool
    old_usage = CONCURRENCY * sum(blocks) / len(blocks) / pool
    assert shared >= 6 and old_usage > 1.0 > prefix_usage + KV_PEAK_TOLERANCE, (shared, own, old_usage, prefix_usage)

    settings = ReplaySettings(
        # 120 requests: a window of several seconds, so that the sampled KV gauge is read inside it
        # many times (24 made a window of about a second, which two samples could miss).
        concurrency=[CONCURRENCY], warmup_requests=8, min_requests=120, metrics_interval_s=0.2, request_timeout_s=300
    )
    # A window whose /metrics samples caught no request running (a CI run read running peak 0 and
    # KV peak 0 while 120 requests finished: the engine ran them between scrapes answered late on a
    # starved machine) says so and cannot show the sharing: it is measured again, at most three times.
    for _ in range(MEASURE_ATTEMPTS):
        results = asyncio.run(run_replay(url=shared_server.url, corpus=corpus, settings=settings, slo={"ttft_p50_ms": 600000}))
        (step,) = results.steps
        server = step.server
        if (server.running_peak or 0) >= 2:
            break
        if server.running_peak:
            # Samples that caught one request running at most (a CI run at 5ad4a12: the client
            # loop starved on two cores) cannot show the sharing either: measured again.
            continue
        if not server.window_sampled:
            continue  # no sample in the window at all: said so by window_sampled, checked below
        assert server.running_peak is None and server.kv_cache_usage_peak is None, server
        assert server.samples_saw_no_work and "no sample caught one running" in server.metrics_note, server
    print(
        f"hit rate: server {server.prefix_cache_hit_rate}, predicted {predicted.hit_rate_unbounded} (LRU of {pool}:"
        f" {predicted.hit_rate_lru}); KV peak {server.kv_cache_usage_peak}, prefix-aware {prefix_usage:.3f},"
        f" old {old_usage:.3f}; running peak {server.running_peak}, preemptions {server.preemptions}"
    )
    # A window that no /metrics sample reached says so (null peaks and a note), never 0.
    assert server.window_sampled and server.samples >= 2, server.metrics_note
    assert server.running_peak, f"{MEASURE_ATTEMPTS} windows caught no request running: {server.metrics_note}"
    assert server.prefix_cache_hit_rate is not None, server.histograms_note
    assert server.prefix_cache_hit_rate == pytest.approx(predicted.hit_rate_unbounded, abs=HIT_RATE_TOLERANCE)
    assert predicted.hit_rate_lru == predicted.hit_rate_unbounded
    # The usage each model predicts at the most requests vLLM was seen running: a client loop
    # starved of CPU on two cores keeps fewer than 8 in flight against a fast server (CI runs saw
    # 1-3), and the prefix-aware model is then judged at what ran, not at what was asked.
    running = int(server.running_peak or 0)
    assert running >= 2, f"vLLM ran at most {running} requests at once: the sharing cannot show"
    prefix_usage = (shared + running * own) / pool
    old_usage = running * sum(blocks) / len(blocks) / pool
    assert server.kv_cache_usage_peak == pytest.approx(prefix_usage, abs=KV_PEAK_TOLERANCE)
    assert abs(server.kv_cache_usage_peak - prefix_usage) < abs(server.kv_cache_usage_peak - old_usage)
