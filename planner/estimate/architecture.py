"""config.json -> the KV-cache layout vLLM builds for it, and a parameter count.

What vLLM stores per token and layer (vllm/v1/kv_cache_interface.py, AttentionSpec):

    standard attention   2 (K and V) x kv_heads_per_rank x head_dim x cache dtype bytes
    MLA (DeepSeek V2/V3) 1 latent vector, one head: (kv_lora_rank + qk_rope_head_dim) x bytes,
                         the same on every tensor-parallel rank (it is replicated, not split)

with kv_heads_per_rank = max(1, kv_heads // tp): grouped-query attention splits the KV heads
across ranks, and when there are fewer KV heads than ranks each rank keeps one (replicated).
Multi-query attention is the kv_heads = 1 case.

Layers are either full attention or sliding-window attention. vLLM's hybrid allocator gives
each kind its own block tables (see `group_layout` below), and a sliding-window layer only
holds the blocks its window needs, so per-request block counts differ by kind; bytes per token
do not. The kinds come from `layer_types` when the config has it, else from the model family's
known pattern (Gemma 2 alternates, Gemma 3 has one full layer in `sliding_window_pattern`),
else from `sliding_window` (Mistral 7B v0.1: every layer), honouring Qwen2's
`use_sliding_window` / `max_window_layers`.

Multimodal and wrapper configs keep the language model under `text_config`; that is what is
sized. Architectures without a softmax-attention KV cache (Mamba, linear attention) are refused
with the keys that were looked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from planner.errors import EstimateError

AttentionKind = Literal["full", "sliding"]

# Bytes per element of the dtype names that appear in config.json (torch_dtype / dtype).
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1}

# --kv-cache-dtype values vLLM accepts that are one byte per element.
FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
CACHE_DTYPE_HELP = "auto (the model's dtype), bfloat16, float16, float32, fp8, fp8_e4m3, fp8_e5m2"

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
_UNSUPPORTED_LAYER_TYPES = ("linear_attention", "mamba", "mamba2", "conv", "recurrent", "deltanet")


@dataclass(frozen=True)
class Moe:
    num_experts: int
    intermediate_size: int
    shared_experts: int = 0
    # DeepSeek: this many leading layers use a dense MLP of `intermediate_size` instead.
    first_dense_layers: int = 0


@dataclass(frozen=True)
class Architecture:
    source: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    # For MLA: 1 (one latent "head").
    num_kv_heads: int
    # Elements per head stored for K and for V (MLA: kv_lora_rank + qk_rope_head_dim and 0).
    head_dim_k: int
    head_dim_v: int
    mla: bool
    layer_kinds: tuple[AttentionKind, ...]
    sliding_window: int | None
    dtype: str
    vocab_size: int | None
    intermediate_size: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    moe: Moe | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def kv_heads_per_rank(self, tp: int) -> int:
        if self.mla:
            return 1
        return max(1, self.num_kv_heads // tp)

    def cache_dtype_bytes(self, kv_cache_dtype: str) -> int:
        return cache_dtype_bytes(kv_cache_dtype, self.dtype)

    def kv_bytes_per_token_per_layer(self, tp: int, kv_cache_dtype: str = "auto") -> int:
        return self.kv_heads_per_rank(tp) * (self.head_dim_k + self.head_dim_v) * self.cache_dtype_bytes(kv_cache_dtype)

    def kv_bytes_per_token(self, tp: int, kv_cache_dtype: str = "auto") -> int:
        """KV bytes one token takes on one GPU, summed over every layer."""
        return self.num_layers * self.kv_bytes_per_token_per_layer(tp, kv_cache_dtype)

    def layer_counts(self) -> dict[AttentionKind, int]:
        counts: dict[AttentionKind, int] = {}
        for kind in self.layer_kinds:
            counts[kind] = counts.get(kind, 0) + 1
        return counts


def cache_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    value = kv_cache_dtype.strip().lower()
    if value == "auto":
        return DTYPE_BYTES[model_dtype]
    if value in FP8_CACHE_DTYPES:
        return 1
    if value in DTYPE_BYTES:
        return DTYPE_BYTES[value]
    raise EstimateError(f"--kv-cache-dtype {kv_cache_dtype!r} is not known; valid: {CACHE_DTYPE_HELP}")


def load_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """Read DIR/config.json (or a config.json file given directly); returns (config, its path)."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        where = f"{p} has no config.json" if p.is_dir() else f"{file} does not exist"
        raise EstimateError(
            f"{where}; --model takes a Hub name (org/name or org/name@revision), a local model folder "
            "(config.json plus safetensors) or a config.json"
        ) from None
    except OSError as exc:
        raise EstimateError(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EstimateError(f"{file}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise EstimateError(f"{file}: expected a JSON object, got {type(config).__name__}")
    return config, str(file)


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def _positive_int(value: Any, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EstimateError(f"{source}: {key} must be a positive integer, got {value!r}")
    return value


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` when present, inheriting the dtype from outside."""
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        return config
    merged = dict(inner)
    for key in ("torch_dtype", "dtype", "tie_word_embeddings", "quantization_config"):
        if key not in merged and key in config:
            merged[key] = config[key]
    return merged


def _dtype(config: dict[str, Any], source: str) -> str:
    value = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    value = str(value).removeprefix("torch.")
    if value not in DTYPE_BYTES:
        raise EstimateError(f"{source}: torch_dtype {value!r} is not known; valid: {', '.join(DTYPE_BYTES)}")
    # vLLM's dtype "auto" serves float32 checkpoints in 16 bits on GPU (vllm/config/model.py).
    return "bfloat16" if DTYPE_BYTES[value] == 4 else value


def _layer_kinds(config: dict[str, Any], num_layers: int, source: str) -> tuple[tuple[AttentionKind, ...], int | None]:
    window = config.get("sliding_window")
    window = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        if len(layer_types) != num_layers:
            raise EstimateError(f"{source}: layer_types has {len(layer_types)} entries but num_hidden_layers is {num_layers}")
        kinds: list[AttentionKind] = []
        for i, name in enumerate(layer_types):
            if name in ("full_attention", "attention", "global"):
                kinds.append("full")
            elif name in ("sliding_attention", "sliding_window", "local", "chunked_attention"):
                if window is None:
                    raise EstimateError(f"{source}: layer_types[{i}] is {name!r} but sliding_window is not set")
                kinds.append("sliding")
            else:
                raise EstimateError(
                    f"{source}: layer_types[{i}] is {name!r}; only softmax attention layers can be sized "
                    f"(full_attention, sliding_attention), not {', '.join(_UNSUPPORTED_LAYER_TYPES)}"
                )
        return tuple(kinds), window
    if window is None:
        return ("full",) * num_layers, None
    model_type = str(config.get("model_type", ""))
    if model_type == "gemma2":
        # vLLM's Gemma 2: even layers use the sliding window, odd layers are global.
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers)), window
    if model_type in ("gemma3", "gemma3_text"):
        pattern = int(config.get("sliding_window_pattern", 6))
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers)), window
    if config.get("use_sliding_window") is False:
        return ("full",) * num_layers, None
    if "max_window_layers" in config and "use_sliding_window" in config:
        first_sliding = int(config["max_window_layers"])
        return tuple("sliding" if i >= first_sliding else "full" for i in range(num_layers)), window
    return ("sliding",) * num_layers, window


def _moe(config: dict[str, Any]) -> Moe | None:
    experts = _first(config, ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts"))
    if not experts:
        return None
    inter = _first(config, ("moe_intermediate_size", "expert_intermediate_size")) or config.get("intermediate_size")
    return Moe(
        num_experts=int(experts),
        intermediate_size=int(inter),
        shared_experts=int(config.get("n_shared_experts") or 0),
        first_dense_layers=int(config.get("first_k_dense_replace") or 0),
    )


def parse_architecture(config: dict[str, Any], source: str = "config.json") -> Architecture:
    """The KV layout of a config.json's language model. Raises EstimateError naming missing keys."""
    text = _text_config(config)
    where = f"{source} (text_config)" if text is not config else source
    layers = _first(text, _LAYER_KEYS)
    heads = _first(text, _HEAD_KEYS)
    hidden = _first(text, _HIDDEN_KEYS)
    missing = [
        "/".join(keys)
        for keys, value in ((_LAYER_KEYS, layers), (_HEAD_KEYS, heads), (_HIDDEN_KEYS, hidden))
        if value is None
    ]
    if missing:
        kind = text.get("model_type") or (text.get("architectures") or ["unknown"])[0]
        raise EstimateError(
            f"{where}: cannot size architecture {kind!r}: missing {', '.join(missing)} "
            "(a decoder with softmax attention needs a layer count, attention heads and the hidden size)"
        )
    layers = _positive_int(layers, "num_hidden_layers", where)
    heads = _positive_int(heads, "num_attention_heads", where)
    hidden = _positive_int(hidden, "hidden_size", where)

    mla = text.get("kv_lora_rank") is not None
    if mla:
        rope = text.get("qk_rope_head_dim")
        if rope is None:
            raise EstimateError(f"{where}: kv_lora_rank is set (MLA) but qk_rope_head_dim is missing")
        kv_heads = 1
        head_k = _positive_int(text["kv_lora_rank"], "kv_lora_rank", where) + _positive_int(rope, "qk_rope_head_dim", where)
        head_v = 0
    else:
        kv_heads = _positive_int(_first(text, _KV_HEAD_KEYS) or heads, "num_key_value_heads", where)
        head_dim = text.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise EstimateError(f"{where}: head_dim is missing and hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
            head_dim = hidden // heads
        head_k = head_v = _positive_int(head_dim, "head_dim", where)

    kinds, window = _layer_kinds(text, layers, where)
    vocab = text.get("vocab_size")
    return Architecture(
        source=source,
        model_type=str(text.get("model_type", "unknown")),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim_k=head_k,
        head_dim_v=head_v,
        mla=mla,
        layer_kinds=kinds,
        sliding_window=window if "sliding" in kinds else None,
        dtype=_dtype(text, where),
        vocab_size=int(vocab) if vocab else None,
        intermediate_size=_first(text, ("intermediate_size", "ffn_dim", "n_inner")),
        max_position_embeddings=_first(text, ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")),
        # Configs that omit the key inherit their class's default: tied for Gemma, untied elsewhere.
        tie_word_embeddings=bool(text.get("tie_word_embeddings", str(text.get("model_type", "")).startswith("gemma"))),
        moe=_moe(text),
        raw=text,
    )


def load_architecture(path: str | Path) -> Architecture:
    config, source = load_config(path)
    return parse_architecture(config, source)


def estimate_parameters(arch: Architecture) -> int:
    """Parameter count of a decoder from its config alone (no checkpoint): a labelled estimate.

    Counts embeddings, attention projections (MLA's low-rank ones included), dense or MoE MLPs
    (gate, up and down), the router, norms and the LM head unless tied. Biases are ignored
    except Qwen2's QKV bias, which its config implies.
    """
    raw = arch.raw
    h = arch.hidden_size
    if arch.vocab_size is None or arch.intermediate_size is None:
        raise EstimateError(f"{arch.source}: cannot count parameters without vocab_size and intermediate_size")
    heads = arch.num_attention_heads
    if arch.mla:
        nope = int(raw.get("qk_nope_head_dim") or 0)
        rope = int(raw["qk_rope_head_dim"])
        v_dim = int(raw.get("v_head_dim") or nope)
        rank = int(raw["kv_lora_rank"])
        q_rank = raw.get("q_lora_rank")
        q_out = heads * (nope + rope)
        q = h * q_out if not q_rank else h * q_rank + q_rank + q_rank * q_out
        attn = q + h * (rank + rope) + rank + rank * heads * (nope + v_dim) + heads * v_dim * h
    else:
        hd = arch.head_dim_k
        attn = h * heads * hd + 2 * h * arch.num_kv_heads * hd + heads * hd * h
        if arch.model_type.startswith("qwen2"):
            attn += heads * hd + 2 * arch.num_kv_heads * hd
    dense_mlp = 3 * h * int(arch.intermediate_size)
    mlp_total = 0
    for i in range(arch.num_layers):
        moe = arch.moe
        if moe is None or i < moe.first_dense_layers:
            mlp_total += dense_mlp
        else:
            mlp_total += (moe.num_experts + moe.shared_experts) * 3 * h * moe.intermediate_size + h * moe.num_experts
    norms_per_layer = 4 if arch.model_type.startswith("gemma2") or arch.model_type.startswith("gemma3") else 2
    embed = arch.vocab_size * h
    lm_head = 0 if arch.tie_word_embeddings else arch.vocab_size * h
    return embed + lm_head + arch.num_layers * (attn + norms_per_layer * h) + mlp_total + h
