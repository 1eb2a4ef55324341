"""The working-memory model and the GPU memory budget that is left for the KV cache.

vLLM 0.32 (vllm/v1/worker/gpu_worker.py, determine_available_memory) sizes the KV pool as

    requested    = ceil(total GPU memory x gpu_memory_utilization)
    available_kv = requested - weights - peak activations of the profiling pass
                   - non-torch memory (CUDA context, cuBLAS workspaces, NCCL buffers)
                   - CUDA graph memory (profiled and subtracted by default since
                     VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS became 1)

and `total - requested` is headroom it never touches. The profiling pass runs one forward of
max_num_batched_tokens dummy tokens and then the sampler on max_num_seqs rows. This module
predicts each term from the architecture:

    activations = max_num_batched_tokens x dtype bytes
                  x (3 x MLP width per rank + (q + k + v) width per rank + 2 x hidden)
                  (the gate/up output, the activated product, the QKV output and two
                  hidden-sized buffers are live at the MLP's peak; for MoE the MLP width is
                  experts_per_token x moe_intermediate_size, shared experts added)
    sampler     = max_num_seqs x vocab x 4 bytes (fp32 logits) x sampler_copies
    non-torch   = cuda_context_gib, plus nccl_gib when tensor_parallel_size > 1
    CUDA graphs = cuda_graphs_gib, 0 with enforce_eager
    reserve     = reserve_gib, kept back for allocator fragmentation (yours to set)

The constants were fitted to published start-up logs (see "Calibration" in docs/guides/memory.md);
every one can be overridden, on the command line or in a sweep's settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from planner.estimate.architecture import Architecture
from planner.estimate.units import GIB


class WorkingMemoryModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cuda_context_gib: float = Field(0.5, ge=0, description="CUDA context and library workspaces per GPU")
    nccl_gib: float = Field(1.75, ge=0, description="NCCL and custom all-reduce buffers per GPU when TP > 1")
    cuda_graphs_gib: float = Field(0.5, ge=0, description="CUDA graph pool per GPU (0 with enforce_eager)")
    activation_factor: float = Field(1.0, gt=0, description="multiplier on the predicted activation peak")
    sampler_copies: float = Field(2.0, ge=0, description="fp32 logits-sized buffers the sampler holds at once")
    reserve_gib: float = Field(0.0, ge=0, description="extra reserve for allocator fragmentation")
    # The verdict calls a margin clear only beyond uncertainty_fraction x working memory +
    # uncertainty_gib: on the calibration logs the model was off by up to 2 GiB
    # (docs/guides/memory.md).
    uncertainty_fraction: float = Field(0.5, ge=0, le=1)
    uncertainty_gib: float = Field(1.0, ge=0)


@dataclass(frozen=True)
class WorkingMemory:
    activations_bytes: int
    sampler_bytes: int
    non_torch_bytes: int
    cuda_graphs_bytes: int
    reserve_bytes: int

    @property
    def activations_and_workspace_bytes(self) -> int:
        return self.activations_bytes + self.sampler_bytes

    @property
    def framework_bytes(self) -> int:
        return self.non_torch_bytes + self.reserve_bytes

    @property
    def total_bytes(self) -> int:
        return self.activations_and_workspace_bytes + self.cuda_graphs_bytes + self.framework_bytes


def _mlp_width(arch: Architecture) -> int:
    moe = arch.moe
    if moe is None:
        return int(arch.intermediate_size or 4 * arch.hidden_size)
    top_k = int(arch.raw.get("num_experts_per_tok") or arch.raw.get("moe_topk") or 2)
    return (top_k + moe.shared_experts) * moe.intermediate_size


def _qkv_width(arch: Architecture, tp: int) -> int:
    heads = arch.num_attention_heads
    if arch.mla:
        raw = arch.raw
        q = heads * (int(raw.get("qk_nope_head_dim") or 0) + int(raw["qk_rope_head_dim"]))
        return math.ceil(q / tp) + arch.head_dim_k
    return math.ceil(heads * arch.head_dim_k / tp) + 2 * arch.kv_heads_per_rank(tp) * arch.head_dim_k


def activation_bytes_per_token(arch: Architecture, tp: int) -> int:
    width = 3 * math.ceil(_mlp_width(arch) / tp) + _qkv_width(arch, tp) + 2 * arch.hidden_size
    return width * arch.dtype_bytes


def working_memory(
    arch: Architecture,
    *,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    enforce_eager: bool,
    device: str,
    model: WorkingMemoryModel,
) -> WorkingMemory:
    activations = model.activation_factor * max_num_batched_tokens * activation_bytes_per_token(arch, tp)
    vocab_per_rank = math.ceil((arch.vocab_size or 0) / tp)
    sampler = max_num_seqs * vocab_per_rank * 4 * model.sampler_copies
    on_gpu = device == "gpu"
    non_torch = (model.cuda_context_gib + (model.nccl_gib if tp > 1 else 0.0)) * GIB if on_gpu else 0.0
    graphs = 0.0 if enforce_eager or not on_gpu else model.cuda_graphs_gib * GIB
    return WorkingMemory(
        activations_bytes=math.ceil(activations),
        sampler_bytes=math.ceil(sampler),
        non_torch_bytes=math.ceil(non_torch),
        cuda_graphs_bytes=math.ceil(graphs),
        reserve_bytes=math.ceil(model.reserve_gib * GIB),
    )


@dataclass(frozen=True)
class Budget:
    """One GPU's memory, split the way vLLM splits it. Every figure is bytes."""

    total_bytes: int
    requested_bytes: int
    weights_bytes: int
    working: WorkingMemory
    # What vLLM would log as "Available KV cache memory" (negative when nothing is left).
    available_kv_bytes: int
    # total - requested with gpu_memory_utilization; total - everything with kv_cache_memory_bytes.
    headroom_bytes: int
    # "gpu_memory_utilization" or "kv_cache_memory_bytes"
    kv_sized_by: str


def gpu_budget(
    *,
    total_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    working: WorkingMemory,
    kv_cache_memory_bytes: int | None,
) -> Budget:
    if kv_cache_memory_bytes is not None:
        # vLLM skips the budget and allocates exactly this; whatever is left of the GPU is headroom.
        used = weights_bytes + working.total_bytes + kv_cache_memory_bytes
        return Budget(
            total_bytes=total_bytes,
            requested_bytes=used,
            weights_bytes=weights_bytes,
            working=working,
            available_kv_bytes=kv_cache_memory_bytes,
            headroom_bytes=total_bytes - used,
            kv_sized_by="kv_cache_memory_bytes",
        )
    requested = math.ceil(total_bytes * gpu_memory_utilization)
    return Budget(
        total_bytes=total_bytes,
        requested_bytes=requested,
        weights_bytes=weights_bytes,
        working=working,
        available_kv_bytes=requested - weights_bytes - working.total_bytes,
        headroom_bytes=total_bytes - requested,
        kv_sized_by="gpu_memory_utilization",
    )
