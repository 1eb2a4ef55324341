"""Activations saved for backward by one micro-batch of a Llama-shaped decoder, per GPU.

Autograd keeps, for each operation, the inputs or outputs its backward formula needs, and only
when that gradient is needed (PyTorch's derivatives.yaml: a Linear saves its input only when its
weight trains, its weight only when its input needs a gradient). So the saved set depends on what
trains, and this module walks the layer the way Hugging Face's LlamaDecoderLayer (transformers 5)
runs it under PyTorch, one tensor at a time, T = micro_batch x seq_len tokens, e = compute dtype
bytes (4 fp32, 2 bf16), with flash-style attention (SDPA's flash kernel on CPU and GPU saves its
output and a per-head log-sum-exp, never the seq x seq scores; CUDA has no fp32 flash kernel, and
in fp32 on an H200 SDPA kept the attention probabilities too, which this walk leaves out: docs/guides/memory.md):

    RMSNorm          input upcast to fp32 (4 T h) and rsqrt(variance) (4 T), when the input needs
                     a gradient; the normalised e T h when the norm's weight trains
    q/k/v_proj       their shared input (e T h) when a weight or an adapter on it trains
    RoPE             cos and sin, once per model (2 x seq_len x head_dim x e)
    attention        q, k, v after RoPE (e T (q + 2 kv)), the output (e T q, also o_proj's
                     input) and the log-sum-exp (4 T heads)
    gate/up_proj     their shared input (e T h) when a weight or an adapter on them trains
    SiLU, product    gate (e T I) for SiLU; act and up (e T I each) for the product
    down_proj        its input (e T I) when its weight or adapter trains
    LoRA             each adapter's A output (e T r) for B, and A's input (shared with the base)
    model            token ids (8 T) for the embedding's gradient, the final norm, the LM head's
                     input, and the loss: Hugging Face upcasts the logits, so log_softmax keeps
                     4 T V, plus the shifted labels (8 T; 8 (T + 1) for one sequence)

Activation checkpointing (Chen et al. 2016) keeps only a checkpointed layer's input (e T h) and
recomputes the rest in backward: `full` checkpoints every layer, `selective` every
`checkpoint_every`-th one (layer i when i % every == 0, torchtitan's layer-level selective
recomputation). Tensor parallelism (Korthikanti et al. 2022) divides the attention and MLP terms
by the TP size and leaves the norms' (no sequence parallelism).

Verified against torch.autograd.graph.saved_tensors_hooks on CPU (tests/e2e/test_train_memory.py)
and on an H200 (scripts/measure-train-gpu.sh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.estimate.architecture import Architecture
from planner.estimate.train_params import Param

Checkpointing = Literal["none", "selective", "full"]

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Shape:
    tokens: int
    seq_len: int
    hidden: int
    q_width: int
    kv_width: int
    heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int
    tp: int

    def split(self, n: int) -> int:
        return math.ceil(n / self.tp)


@dataclass(frozen=True)
class LayerTraining:
    """What trains in one decoder layer: base weights by module name, and LoRA ranks."""

    weights: frozenset[str]
    lora: dict[str, int]

    def touches(self, module: str) -> bool:
        return module in self.weights or module in self.lora


@dataclass(frozen=True)
class Activations:
    """Saved bytes on one GPU for one micro-batch."""

    layers_bytes: int
    model_bytes: int
    checkpointed_layers: int
    # One layer's saved bytes without checkpointing: what backward recomputes at a time.
    largest_layer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.layers_bytes + self.model_bytes


def _norm(s: Shape, input_grad: bool, weight_trains: bool) -> int:
    saved = (4 * s.tokens * s.hidden + 4 * s.tokens) if input_grad else 0
    return saved + (s.dtype_bytes * s.tokens * s.hidden if weight_trains else 0)


def layer_saved(s: Shape, t: LayerTraining, input_grad: bool, norms_train: tuple[bool, bool]) -> tuple[int, bool, bool]:
    """(bytes saved by one layer, whether its output needs a gradient, whether RoPE's cos/sin are saved)."""
    e, tok = s.dtype_bytes, s.tokens
    total = _norm(s, input_grad, norms_train[0])
    normed_grad = input_grad or norms_train[0]
    if any(t.touches(m) for m in ("q_proj", "k_proj", "v_proj")):
        total += e * tok * s.hidden
    grads = {m: normed_grad or t.touches(m) for m in ("q_proj", "k_proj", "v_proj")}
    attention_grad = any(grads.values())
    rope = grads["q_proj"] or grads["k_proj"]
    q, kv = s.split(s.q_width), s.split(s.kv_width)
    if attention_grad:
        total += e * tok * (2 * q + 2 * kv) + 4 * tok * s.split(s.heads)
    elif t.touches("o_proj"):
        total += e * tok * q
    out_grad = attention_grad or t.touches("o_proj")
    mid_grad = input_grad or out_grad

    total += _norm(s, mid_grad, norms_train[1])
    normed2_grad = mid_grad or norms_train[1]
    if t.touches("gate_proj") or t.touches("up_proj"):
        total += e * tok * s.hidden
    inter = s.split(s.intermediate)
    gate_grad = normed2_grad or t.touches("gate_proj")
    up_grad = normed2_grad or t.touches("up_proj")
    total += e * tok * inter * (int(gate_grad) + int(up_grad) + int(gate_grad))
    if t.touches("down_proj"):
        total += e * tok * inter
    total += sum(e * tok * rank for rank in t.lora.values())
    output_grad = mid_grad or gate_grad or up_grad or t.touches("down_proj")
    return total, output_grad, rope


def checkpointed(layer: int, mode: Checkpointing, every: int) -> bool:
    return mode == "full" or (mode == "selective" and layer % every == 0)


def shape_for(arch: Architecture, *, micro_batch: int, seq_len: int, dtype_bytes: int, tp: int) -> Shape:
    return Shape(
        tokens=micro_batch * seq_len,
        seq_len=seq_len,
        hidden=arch.hidden_size,
        q_width=arch.num_attention_heads * arch.head_dim_k,
        kv_width=arch.kv_heads_per_rank(tp) * arch.head_dim_k * tp,
        heads=arch.num_attention_heads,
        head_dim=arch.head_dim_k,
        intermediate=int(arch.intermediate_size or 4 * arch.hidden_size),
        vocab=int(arch.vocab_size or 0),
        dtype_bytes=dtype_bytes,
        tp=tp,
    )


def layer_training(params: list[Param], num_layers: int) -> list[LayerTraining]:
    weights: list[set[str]] = [set() for _ in range(num_layers)]
    lora: list[dict[str, int]] = [{} for _ in range(num_layers)]
    for p in params:
        if p.layer is None or not p.trains or p.layer >= num_layers:
            continue
        if p.kind == "lora":
            module = p.name.split(".")[-3]
            if p.name.endswith("lora_A.weight"):
                lora[p.layer][module] = p.shape[0]
        else:
            weights[p.layer].add(p.module)
    return [LayerTraining(frozenset(w), l) for w, l in zip(weights, lora, strict=True)]


def saved_activations(
    arch: Architecture,
    params: list[Param],
    *,
    micro_batch: int,
    seq_len: int,
    dtype_bytes: int,
    checkpointing: Checkpointing,
    checkpoint_every: int,
    tp: int,
) -> Activations:
    s = shape_for(arch, micro_batch=micro_batch, seq_len=seq_len, dtype_bytes=dtype_bytes, tp=tp)
    trains = {p.name for p in params if p.trains and p.kind == "base"}
    embed_trains = any("embed_tokens" in n for n in trains)
    lm_head_trains = any(n.startswith("lm_head") for n in trains) or (arch.tie_word_embeddings and embed_trains)
    final_norm_trains = any(n.endswith("norm.weight") and Param(n, (1,), True).layer is None for n in trains)

    grad = embed_trains
    layers = rope = 0
    largest = 0
    kept = 0
    for i, training in enumerate(layer_training(params, arch.num_layers)):
        norms = ("input_layernorm" in training.weights, "post_attention_layernorm" in training.weights)
        saved, out_grad, uses_rope = layer_saved(s, training, grad, norms)
        largest = max(largest, saved)
        if checkpointed(i, checkpointing, checkpoint_every):
            kept += 1
            layers += s.dtype_bytes * s.tokens * s.hidden
        else:
            layers += saved
            rope = rope or uses_rope
        grad = out_grad

    model = 8 * s.tokens if embed_trains else 0
    model += 2 * s.seq_len * s.head_dim * s.dtype_bytes if rope else 0
    model += _norm(s, grad, final_norm_trains)
    if lm_head_trains:
        model += s.dtype_bytes * s.tokens * s.hidden
    if grad or lm_head_trains:
        # Hugging Face pads the labels by one and shifts them; with one sequence the shifted
        # slice is already contiguous and keeps the padded storage (T + 1 ids).
        labels = 8 * (s.tokens + 1 if s.tokens == s.seq_len else s.tokens)
        model += 4 * s.tokens * s.split(s.vocab) + labels + 4
    return Activations(layers_bytes=layers, model_bytes=model, checkpointed_layers=kept, largest_layer_bytes=largest)
