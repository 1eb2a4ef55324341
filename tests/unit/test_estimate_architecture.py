"""KV bytes per token for published architectures, each computed by hand from its config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import EstimateError
from planner.estimate.architecture import estimate_parameters, load_architecture, parse_architecture

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"


def arch(name: str):
    return load_architecture(CONFIGS / f"{name}.json")


def test_llama_3_8b_gqa():
    a = arch("llama-3-8b")
    # 32 layers x 2 (K,V) x 8 KV heads x 128 head_dim x 2 bytes (bf16)
    assert a.kv_bytes_per_token(tp=1) == 32 * 2 * 8 * 128 * 2 == 131_072
    # TP 2 splits the 8 KV heads 4 per rank.
    assert a.kv_bytes_per_token(tp=2) == 32 * 2 * 4 * 128 * 2 == 65_536
    assert a.kv_bytes_per_token(tp=1, kv_cache_dtype="fp8") == 32 * 2 * 8 * 128 * 1
    assert a.layer_counts() == {"full": 32}


def test_llama_3_70b_replicates_kv_heads_beyond_eight_ranks():
    a = arch("llama-3-70b")
    assert a.kv_bytes_per_token(tp=1) == 80 * 2 * 8 * 128 * 2 == 327_680
    assert a.kv_bytes_per_token(tp=4) == 80 * 2 * 2 * 128 * 2 == 81_920
    # 8 KV heads over 16 ranks: each rank keeps max(1, 8 // 16) = 1 head.
    assert a.kv_bytes_per_token(tp=16) == 80 * 2 * 1 * 128 * 2 == 40_960


def test_mistral_7b_every_layer_sliding():
    a = arch("mistral-7b-v0.1")
    assert a.kv_bytes_per_token(tp=1) == 32 * 2 * 8 * 128 * 2
    assert a.layer_counts() == {"sliding": 32}
    assert a.sliding_window == 4096


def test_mixtral_moe_has_dense_attention():
    a = arch("mixtral-8x7b-v0.1")
    assert a.kv_bytes_per_token(tp=1) == 32 * 2 * 8 * 128 * 2
    assert a.moe is not None and a.moe.num_experts == 8
    assert a.layer_counts() == {"full": 32}


def test_qwen2_5_7b_ignores_disabled_sliding_window():
    a = arch("qwen2.5-7b")
    # head_dim = 3584 / 28 = 128; 4 KV heads
    assert a.kv_bytes_per_token(tp=1) == 28 * 2 * 4 * 128 * 2 == 57_344
    assert a.layer_counts() == {"full": 28}
    assert a.sliding_window is None


def test_gemma_2_9b_alternates_sliding_and_full_and_serves_fp32_in_bf16():
    a = arch("gemma-2-9b")
    # head_dim 256 is explicit (hidden 3584 / 16 heads would be 224).
    assert a.kv_bytes_per_token(tp=1) == 42 * 2 * 8 * 256 * 2 == 344_064
    assert a.layer_counts() == {"sliding": 21, "full": 21}
    assert a.layer_kinds[:2] == ("sliding", "full")
    assert a.dtype == "bfloat16"


def test_deepseek_v2_lite_mla_one_latent_head_not_split_by_tp():
    a = arch("deepseek-v2-lite")
    # 27 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes, no separate V
    assert a.kv_bytes_per_token(tp=1) == 27 * (512 + 64) * 2 == 31_104
    assert a.kv_bytes_per_token(tp=4) == 31_104
    assert a.mla


@pytest.mark.parametrize(
    ("name", "published_b"),
    [
        ("llama-3-8b", 8.03),
        ("llama-3-70b", 70.55),
        ("mistral-7b-v0.1", 7.24),
        ("mixtral-8x7b-v0.1", 46.70),
        ("qwen2.5-7b", 7.62),
        ("gemma-2-9b", 9.24),
        ("deepseek-v2-lite", 15.7),
    ],
)
def test_parameter_count_from_config_matches_published_size(name, published_b):
    assert estimate_parameters(arch(name)) / 1e9 == pytest.approx(published_b, rel=0.01)


def test_text_config_is_sized_and_inherits_dtype():
    llama = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    wrapper = {"model_type": "llava", "torch_dtype": "float16", "text_config": {k: v for k, v in llama.items() if k != "torch_dtype"}}
    a = parse_architecture(wrapper, "wrapper/config.json")
    assert a.kv_bytes_per_token(tp=1) == 131_072
    assert a.dtype == "float16"


def test_layer_types_drive_the_pattern():
    cfg = {"model_type": "x", "num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64,
           "num_key_value_heads": 1, "sliding_window": 512,
           "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]}  # fmt: skip
    a = parse_architecture(cfg)
    # multi-query: one KV head, head_dim 16
    assert a.kv_bytes_per_token(tp=1) == 4 * 2 * 1 * 16 * 2
    assert a.layer_counts() == {"sliding": 3, "full": 1}


def test_unknown_architecture_names_the_missing_keys():
    with pytest.raises(EstimateError) as exc:
        parse_architecture({"model_type": "mamba", "d_state": 16, "vocab_size": 100}, "m/config.json")
    msg = str(exc.value)
    assert "m/config.json" in msg and "'mamba'" in msg
    assert "num_hidden_layers/n_layer/num_layers/n_layers" in msg
    assert "num_attention_heads/n_head/num_heads" in msg


def test_linear_attention_layers_are_refused():
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "layer_types": ["linear_attention", "full_attention"]}
    with pytest.raises(EstimateError, match=r"layer_types\[0\] is 'linear_attention'"):
        parse_architecture(cfg)


def test_mla_without_rope_dim_is_an_error():
    with pytest.raises(EstimateError, match="qk_rope_head_dim is missing"):
        parse_architecture({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "kv_lora_rank": 32})


def test_missing_folder_and_bad_json(tmp_path):
    with pytest.raises(EstimateError, match="has no config.json"):
        load_architecture(tmp_path)
    (tmp_path / "config.json").write_text('{"a": 1,\n  oops}')
    with pytest.raises(EstimateError, match=r"config.json:2: not valid JSON"):
        load_architecture(tmp_path)
