"""KV pool, verdict and the sweep's estimate_point, against what vLLM 0.32 reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import ConfigError
from planner.estimate import estimate_point, kv_tokens_relative_error
from planner.estimate.architecture import load_architecture
from planner.estimate.kv_pool import pool_layout
from planner.estimate.units import parse_vllm_int

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"

# Hidden 64, 2 layers, 4 heads, 2 KV heads (head_dim 16), bf16: the 256 KV bytes per token of
# scripts/tinymodel.py's model, which gets them from 1 KV head of head_dim 32.
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture
def tiny(tmp_path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


@pytest.mark.parametrize(
    ("text", "value"),
    [("2M", 2 * 2**20), ("256K", 256 * 2**10), ("1G", 2**30), ("2m", 2_000_000), ("25.6k", 25_600), ("4096", 4096)],
)
def test_sizes_parse_like_vllm(text, value):
    assert parse_vllm_int(text, what="--kv-cache-memory-bytes") == value


def test_decimal_with_binary_suffix_is_refused_like_vllm():
    with pytest.raises(ConfigError, match=r"--kv-cache-memory-bytes: '1.5G' has a decimal"):
        parse_vllm_int("1.5G", what="--kv-cache-memory-bytes")
    with pytest.raises(ConfigError, match="expected an integer"):
        parse_vllm_int("two", what="--max-num-batched-tokens")


def test_tiny_cpu_2m_pool_matches_vllm(tiny):
    # Real vLLM 0.32 CPU: "CPU KV cache size: 8,192 tokens, Maximum concurrency for 1,024 tokens per request: 8.00x"
    p = estimate_point(str(tiny), {"max_model_len": 1024, "kv_cache_memory_bytes": "2M"}, device="cpu")
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2 == 256
    assert p.kv_cache_tokens == 8192
    assert p.max_concurrency == 8.0
    assert p.kv_pool.num_blocks == 2 * 2**20 // (128 * 256) == 64
    assert p.kv_pool.usable_blocks == 63
    assert p.verdict.status == "fits" and p.verdict.clear_margin


def test_tiny_cpu_1g_pool_matches_vllm(tiny):
    p = estimate_point(str(tiny), {"max_model_len": "1024", "kv_cache_memory_bytes": "1G"}, device="cpu")
    assert p.kv_cache_tokens == 4_194_304


def test_tiny_cpu_256k_at_2048_does_not_fit_and_estimates_896(tiny):
    # Real vLLM: "... the estimated maximum model length is 896": 8 blocks - null block = 7 x 128.
    p = estimate_point(str(tiny), {"max_model_len": 2048, "kv_cache_memory_bytes": "256K"}, device="cpu")
    v = p.verdict
    assert v.status == "does_not_fit" and v.reason == "kv_too_small"
    assert v.largest_fitting_max_model_len == 896
    # One 2048-token request is 16 blocks plus the null block = 17 x 32 KiB; the pool is 8 blocks.
    assert v.missing_bytes == 17 * 32768 - 256 * 1024
    assert v.uncertainty_bytes == 0 and v.clear_margin


def test_cpu_without_pool_size_is_unknown(tiny):
    p = estimate_point(str(tiny), {"max_model_len": 1024}, device="cpu")
    assert p.verdict.status == "unknown"
    assert p.kv_cache_tokens is None


def test_gemma_2_hybrid_groups_and_sliding_blocks():
    a = load_architecture(CONFIGS / "gemma-2-9b.json")
    layout = pool_layout(a, tp=1, kv_cache_dtype="auto", block_size=16, in_flight_tokens=2048)
    # 21 sliding + 21 full: two groups of 21 layers; a block holds 21 layers' pages.
    assert [g.kind for g in layout.groups] == ["sliding", "full"]
    assert layout.bytes_per_block == 21 * 16 * (2 * 8 * 256 * 2)
    # 8192 tokens: full group 512 blocks; sliding holds min(4095 + 2048, 8192) tokens -> 384 + 1.
    assert layout.blocks_for_tokens(8192) == 512 + 385
    assert layout.blocks_for_tokens(1000) == 63 + 64


def test_gpu_point_fits_llama_3_8b_on_h100():
    p = estimate_point(str(CONFIGS / "llama-3-8b.json"), {"max_model_len": 8192, "gpu_memory_utilization": 0.9}, gpu="h100-80gb",
                       gpu_memory_bytes=None)  # fmt: skip
    b = p.budget
    assert p.weights.source == "config"
    assert b.requested_bytes == pytest.approx(0.9 * b.total_bytes, abs=1)
    assert b.available_kv_bytes == (
        b.requested_bytes - b.weights_bytes - b.activations_and_workspace_bytes - b.cuda_graphs_bytes - b.framework_and_reserve_bytes
    )
    # kv_cache_tokens = blocks x 16 since 8192 is a whole number of blocks.
    assert p.kv_cache_tokens == p.kv_pool.num_blocks * 16
    assert p.kv_pool.num_blocks == b.available_kv_bytes // (16 * 131072)
    assert p.verdict.status == "fits"
    assert p.settings.max_num_batched_tokens == 8192 and p.settings.max_num_seqs == 1024


def test_llama_70b_on_one_h100_does_not_fit_by_a_clear_margin_and_tp4_does():
    cfg = str(CONFIGS / "llama-3-70b.json")
    one = estimate_point(cfg, {"max_model_len": 8192}, gpu="h100-80gb")
    assert one.verdict.status == "does_not_fit"
    assert one.verdict.reason == "no_kv_memory"
    assert one.verdict.clear_margin
    assert one.verdict.largest_fitting_max_model_len is None
    four = estimate_point(cfg, {"max_model_len": 8192, "tensor_parallel_size": 4}, gpu="h100-80gb")
    assert four.verdict.status == "fits"
    assert four.kv_bytes_per_token == 81_920


def test_heads_not_divisible_is_refused():
    p = estimate_point(str(CONFIGS / "qwen2.5-7b.json"), {"max_model_len": 4096, "tensor_parallel_size": 3}, gpu="l40s")
    assert p.verdict.reason == "heads_not_divisible"
    assert "(28) must be divisible by tensor parallel size (3)" in p.verdict.message


def test_gpu_explicit_pool_over_the_device_is_gpu_oom():
    p = estimate_point(str(CONFIGS / "llama-3-8b.json"), {"max_model_len": 8192, "kv_cache_memory_bytes": "20G"}, gpu="l4")
    assert p.verdict.reason == "gpu_oom"
    assert p.budget.headroom_bytes < 0


def test_long_context_that_does_not_fit_reports_the_largest_that_does():
    p = estimate_point(str(CONFIGS / "qwen2.5-7b.json"), {"max_model_len": 131072, "gpu_memory_utilization": 0.9}, gpu="l4")
    v = p.verdict
    assert v.status == "does_not_fit" and v.reason == "kv_too_small"
    largest = v.largest_fitting_max_model_len
    assert 0 < largest < 131072
    ok = estimate_point(str(CONFIGS / "qwen2.5-7b.json"), {"max_model_len": largest, "gpu_memory_utilization": 0.9}, gpu="l4")
    assert ok.verdict.status == "fits"
    over = estimate_point(str(CONFIGS / "qwen2.5-7b.json"), {"max_model_len": largest + 16, "gpu_memory_utilization": 0.9}, gpu="l4")
    assert over.verdict.status == "does_not_fit"


def test_bad_flag_value_names_the_flag(tiny):
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        estimate_point(str(tiny), {"max_model_len": 1024, "gpu_memory_utilization": 1.5}, gpu="l4")


def test_relative_error():
    assert kv_tokens_relative_error(8192, 8192) == 0.0
    assert kv_tokens_relative_error(9000, 10000) == -0.1
    assert kv_tokens_relative_error(None, 10) is None
    assert kv_tokens_relative_error(10, 0) is None
