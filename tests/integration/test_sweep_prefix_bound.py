"""The sweep's two KV bounds against the fake vLLM: a corpus that shares a 4-block system prompt,
one point with vLLM's default (prefix caching on) and one with --no-enable-prefix-caching.

The fake tokenizes 4 bytes a token; its block size is 128. Each prompt: 512 tokens of system
prompt (4 full blocks, shared by every request) and a short question, plus 16 output tokens: 5
blocks, 1 of them its own. With the cache the search starts from the prefix-aware bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.sweep.results import SweepResults
from tests.fakes.sweep_files import write_sweep_config


def _config(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    system = "S" * (4 * 512)
    corpus.write_text("".join(json.dumps({"prompt": system + f"question {i:02d}?", "max_tokens": 16}) + "\n" for i in range(60)))
    return write_sweep_config(
        tmp_path,
        corpus=corpus,
        env={"FAKE_VLLM_ITL_S": "0.002", "FAKE_VLLM_TTFT_S": "0.002"},
        grid={"max_model_len": [2048]},
        extra={"kv_cache_memory_bytes": ["1M"], "enable_prefix_caching": [True, False]},
        replay={"min_requests": 20, "max_window_s": 30, "request_timeout_s": 30},
        slo={"error_rate": 0},
    )


@pytest.mark.timeout(300)
def test_the_search_starts_from_the_prefix_aware_bound_unless_the_cache_is_off(tmp_path: Path):
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(_config(tmp_path)), "--output", str(out)]) == 0
    cached, uncached = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert "--no-enable-prefix-caching" in uncached.command and "--no-enable-prefix-caching" not in cached.command
    pool = cached.capacity.kv_cache_tokens // 128
    for p in (cached, uncached):
        assert p.status == "ok", p.failure
        assert p.mean_blocks_per_request == 5.0
        assert p.concurrency_upper_bound == max(pool // 5, int(p.capacity.max_concurrency_reported))
    assert cached.prefix_caching and not uncached.prefix_caching
    assert (cached.shared_prefix_blocks, cached.mean_own_blocks_per_request) == (4, 1.0)
    # 4 shared blocks once + n x 1 own block <= pool.
    assert cached.concurrency_upper_bound_prefix_cache == pool - 4 > cached.concurrency_upper_bound
    assert cached.search_upper_bound == cached.concurrency_upper_bound_prefix_cache
    assert uncached.concurrency_upper_bound_prefix_cache is None
    assert uncached.search_upper_bound == uncached.concurrency_upper_bound
    # The fake's counters: every measured request finds the 4 shared blocks (512 of its 515 tokens).
    assert cached.steps[0].server.prefix_cache_hit_rate == round(512 / 515, 4)
    assert uncached.steps[0].server.prefix_cache_hit_rate is None
