"""The parameters a training run holds, and which of them train.

The inventory is every weight tensor of the model, by name and shape: read from the folder's
safetensors headers when there are any (exact, the serving estimate's reader), else built from
config.json with Hugging Face's Llama names (model.embed_tokens, model.layers.N.self_attn.q_proj,
..., lm_head; the LM head only when the embeddings are not tied, since tied weights are one
tensor). The trainable set then marks each tensor:

    full            every tensor trains
    freeze_layers K the embeddings and decoder layers 0..K-1 are frozen, the rest train
    LoRA (rank r)   every base tensor is frozen; each target Linear (by module name, e.g.
                    q_proj) gets A (r x in) and B (out x r), which train (Hu et al. 2021, "LoRA";
                    peft's LoraConfig names targets the same way)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from planner.errors import EstimateError
from planner.estimate.architecture import Architecture
from planner.estimate.model_source import ModelSource

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# Row-parallel Linears under Megatron-style tensor parallelism split their input dimension;
# the others (column-parallel, embeddings, LM head) split their output (Shoeybi et al. 2019).
_ROW_PARALLEL = ("o_proj", "down_proj")


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    trains: bool
    # "base" (a model weight) or "lora" (an adapter added for training)
    kind: str = "base"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def module(self) -> str:
        """The owning module's last name: q_proj for model.layers.0.self_attn.q_proj.weight."""
        parts = self.name.split(".")
        return parts[-2] if len(parts) >= 2 else parts[0]

    @property
    def layer(self) -> int | None:
        match = _LAYER.search(self.name)
        return int(match.group(1)) if match else None

    def per_rank(self, tp: int, num_kv_heads: int) -> int:
        """Elements one tensor-parallel rank holds: 2-D weights split, 1-D ones replicated."""
        if tp <= 1 or len(self.shape) < 2:
            return self.numel
        if self.module in ("k_proj", "v_proj") and num_kv_heads < tp:
            return math.ceil(self.numel / num_kv_heads)
        return math.ceil(self.numel / tp)


def config_inventory(arch: Architecture) -> list[tuple[str, tuple[int, ...]]]:
    """Llama-named weight shapes from config.json alone (no checkpoint)."""
    if arch.vocab_size is None or arch.intermediate_size is None:
        raise EstimateError(f"{arch.source}: a training estimate needs vocab_size and intermediate_size")
    h, v, inter = arch.hidden_size, arch.vocab_size, int(arch.intermediate_size)
    q, kv = arch.num_attention_heads * arch.head_dim_k, arch.num_kv_heads * arch.head_dim_k
    bias = bool(arch.raw.get("attention_bias")) or arch.model_type.startswith("qwen2")
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
    for i in range(arch.num_layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
        if bias:
            shapes += [(p + "self_attn.q_proj.bias", (q,)), (p + "self_attn.k_proj.bias", (kv,)), (p + "self_attn.v_proj.bias", (kv,))]
    shapes.append(("model.norm.weight", (h,)))
    if not arch.tie_word_embeddings:
        shapes.append(("lm_head.weight", (v, h)))
    return shapes


def inventory(model: ModelSource, arch: Architecture) -> tuple[list[tuple[str, tuple[int, ...]]], str]:
    """(name, shape) of every weight, and where they came from: "safetensors" or "config"."""
    checkpoint = model.checkpoint()
    if checkpoint is not None:
        return [(t.name, t.shape) for t in checkpoint.tensors], "safetensors"
    return config_inventory(arch), "config"


def trainable_set(
    shapes: list[tuple[str, tuple[int, ...]]],
    *,
    num_layers: int,
    freeze_layers: int,
    lora_rank: int | None,
    lora_targets: tuple[str, ...],
) -> list[Param]:
    """Every tensor the run holds, base weights and adapters, each marked trains or frozen."""
    if freeze_layers > num_layers:
        raise EstimateError(f"--freeze-layers {freeze_layers} is more than the model's {num_layers} layers")
    params: list[Param] = []
    if lora_rank:
        found = set()
        for name, shape in shapes:
            base = Param(name, shape, trains=False)
            params.append(base)
            if base.module in lora_targets and name.endswith(".weight") and len(shape) == 2:
                found.add(base.module)
                out_features, in_features = shape
                stem = name.removesuffix(".weight")
                params.append(Param(f"{stem}.lora_A.weight", (lora_rank, in_features), trains=True, kind="lora"))
                params.append(Param(f"{stem}.lora_B.weight", (out_features, lora_rank), trains=True, kind="lora"))
        missing = sorted(set(lora_targets) - found)
        if missing:
            modules = sorted({Param(n, s, False).module for n, s in shapes if len(s) == 2})
            raise EstimateError(f"--lora-targets {','.join(missing)}: no such Linear module in the model; its modules: {', '.join(modules)}")
        return params
    for name, shape in shapes:
        layer = Param(name, shape, trains=True).layer
        frozen = freeze_layers > 0 and (layer is None and "embed" in name or layer is not None and layer < freeze_layers)
        params.append(Param(name, shape, trains=not frozen))
    return params
