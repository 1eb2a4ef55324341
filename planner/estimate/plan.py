"""One estimate: settings in, a typed prediction out (`planner estimate --json` prints its dump).

The steps follow a capacity plan: weights first (a lower bound), then KV bytes per token for
the exact architecture and cache dtype, then working memory, then the pool that is left, its
blocks and tokens, the concurrency it carries, and a verdict with its margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

from planner.errors import ConfigError, EstimateError
from planner.estimate import fit
from planner.estimate.architecture import Architecture, AttentionKind, estimate_parameters
from planner.estimate.fit import Verdict
from planner.estimate.gpu_catalog import lookup
from planner.estimate.kv_pool import Pool, PoolLayout, corpus_concurrency, pool_layout, size_pool
from planner.estimate.memory import Budget, WorkingMemoryModel, gpu_budget, working_memory
from planner.estimate.model_source import ModelSource, resolve_model
from planner.estimate.units import GIB, parse_vllm_int
from planner.estimate.weights import Weights, config_weights, tensor_weights

Device = Literal["gpu", "cpu"]

# vLLM 0.32's default block sizes: CUDA attention backends 16, the CPU backend 128.
DEFAULT_BLOCK_SIZE = {"gpu": 16, "cpu": 128}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92


class EstimateSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    device: Device = "gpu"
    gpu: str | None = None
    gpu_memory_bytes: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    kv_cache_dtype: str = "auto"
    block_size: int | None = Field(None, ge=1)
    kv_cache_memory_bytes: int | None = Field(None, ge=0)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    enforce_eager: bool = False
    # None: on for GPU (vLLM's default there), off for CPU.
    async_scheduling: bool | None = None
    working: WorkingMemoryModel = Field(default_factory=WorkingMemoryModel)

    @field_validator("kv_cache_memory_bytes", "max_num_batched_tokens", "max_model_len", mode="before")
    @classmethod
    def _human_int(cls, value: Any, info) -> Any:
        if value is None or isinstance(value, int):
            return value
        return parse_vllm_int(value, what=f"--{info.field_name.replace('_', '-')}")


class _Section(BaseModel):
    # strict: a figure of the wrong type is a bug here, not something to coerce on the way out.
    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def copied(cls, source: object, **others: Any) -> Self:
        """The section with each field not in `others` read from `source`'s attribute of that name:
        for a computed figure (the pool, the weights, the layout) that keeps its own names here."""
        return cls(**{name: getattr(source, name) for name in cls.model_fields if name not in others}, **others)


class ModelFacts(_Section):
    # The model as given: a local path or a Hub name (org/name[@revision]).
    path: str
    config: str
    # The Hub commit the config and the safetensors headers were read at; None for a local folder.
    revision: str | None = None
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    kv_heads_per_rank: int
    head_dim: int
    mla: bool
    layer_kinds: dict[AttentionKind, int]
    sliding_window: int | None
    dtype: str
    max_position_embeddings: int | None


class SettingsUsed(_Section):
    """The settings with vLLM's defaults filled in, as the estimate used them."""

    device: Device
    gpu: str | None
    gpu_memory_bytes: int | None
    gpu_memory_utilization: float
    tensor_parallel_size: int
    max_model_len: int
    kv_cache_dtype: str
    block_size: int
    kv_cache_memory_bytes: int | None
    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool
    working_memory_model: WorkingMemoryModel


class WeightsFacts(_Section):
    source: str
    exact: bool
    lower_bound: bool
    total_bytes: int
    per_gpu_bytes: int
    tensors: int
    files: int
    parameters: int | None
    # Where the tensors were read: "local files", "Hub cache", "Hub headers" (ranged reads of each
    # file's header, no weights), or "config.json" (the parameter-count estimate).
    read_from: str | None = None


class LayoutFacts(_Section):
    block_size: int
    bytes_per_block: int
    groups: list[str]
    layers_per_group: int
    padding_layers: int
    in_flight_tokens: int


class BudgetFacts(_Section):
    total_bytes: int
    requested_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    activations_and_workspace_bytes: int
    activations_bytes: int
    sampler_bytes: int
    cuda_graphs_bytes: int
    framework_and_reserve_bytes: int
    headroom_bytes: int
    available_kv_bytes: int
    kv_sized_by: str


class PoolFacts(_Section):
    bytes: int
    num_blocks: int
    usable_blocks: int
    block_size: int
    blocks_per_request: int
    usable_tokens: int
    max_concurrency: float


class Estimate(_Section):
    """The whole prediction for one configuration. Its `model_dump(mode="json")` is what
    `planner estimate --json` prints and what sweep.json keeps as a point's `prediction`."""

    model: ModelFacts
    settings: SettingsUsed
    weights: WeightsFacts
    kv_bytes_per_token: int
    kv_bytes_per_token_per_layer: int
    layout: LayoutFacts
    # None for a CPU estimate or one whose pool was given directly.
    budget: BudgetFacts | None
    # None (and kv_cache_tokens, max_concurrency) when the pool size is unknown.
    kv_pool: PoolFacts | None
    kv_cache_tokens: int | None
    max_concurrency: float | None
    # The corpus-aware concurrency (planner.estimate.kv_pool.corpus_concurrency) and the corpus it
    # was measured on, when request tokens were given.
    corpus: dict[str, Any] | None
    verdict: Verdict
    estimates: list[str]


def default_batch(device: Device, total_bytes: int | None, gpu: str | None, tp: int) -> tuple[int, int]:
    """vLLM 0.32's serve defaults for (max_num_batched_tokens, max_num_seqs); see arg_utils.get_batch_defaults."""
    if device == "cpu":
        return 2048 * tp, 128 * tp
    total = total_bytes or 0
    if total >= 160 * GIB:
        return 16384, 1024
    if total >= 70 * GIB and "a100" not in (gpu or ""):
        return 8192, 1024
    return 2048, 256


def _weights(settings: EstimateSettings, arch: Architecture, source: ModelSource) -> Weights:
    tp = settings.tensor_parallel_size
    checkpoint = source.checkpoint()
    if checkpoint is not None:
        return tensor_weights(checkpoint.tensors, checkpoint.files, tp, None if arch.mla else arch.num_kv_heads)
    quant = arch.raw.get("quantization_config") or {}
    bits = quant.get("bits") or quant.get("w_bit")
    if bits:
        # Packed integers plus one 16-bit scale and zero point per group.
        group = int(quant.get("group_size") or quant.get("q_group_size") or 128)
        per_param = int(bits) / 8 + 4 / max(group, 1)
    else:
        per_param = arch.dtype_bytes
    return config_weights(estimate_parameters(arch), per_param, tp)


def gpu_total(gpu_memory_bytes: int | None, gpu: str | None) -> tuple[int | None, str | None]:
    """(the GPU's memory in bytes, its catalogue name): an explicit size wins over --gpu's figure."""
    if gpu_memory_bytes is not None:
        return gpu_memory_bytes, gpu
    if gpu is not None:
        found = lookup(gpu)
        return found.total_bytes, found.name
    return None, None


def _budget_facts(budget: Budget, pool: Pool) -> BudgetFacts:
    w = budget.working
    return BudgetFacts(
        total_bytes=budget.total_bytes,
        requested_bytes=budget.requested_bytes,
        weights_bytes=budget.weights_bytes,
        kv_cache_bytes=pool.bytes,
        activations_and_workspace_bytes=w.activations_and_workspace_bytes,
        activations_bytes=w.activations_bytes,
        sampler_bytes=w.sampler_bytes,
        cuda_graphs_bytes=w.cuda_graphs_bytes,
        framework_and_reserve_bytes=w.framework_bytes,
        headroom_bytes=budget.headroom_bytes,
        available_kv_bytes=budget.available_kv_bytes,
        kv_sized_by=budget.kv_sized_by,
    )


def _layout_facts(layout: PoolLayout) -> LayoutFacts:
    return LayoutFacts.copied(
        layout,
        groups=[g.kind if g.sliding_window is None else f"sliding({g.sliding_window})" for g in layout.groups],
        layers_per_group=layout.group_size,
    )


def estimate(
    settings: EstimateSettings,
    *,
    request_tokens: list[int] | None = None,
    corpus_info: dict | None = None,
    prompt_hashes: Callable[[int], list[list[int]]] | None = None,
) -> Estimate:
    """The whole prediction for one configuration. `prompt_hashes(block_size)` gives the corpus's
    prompt blocks for the figure with vLLM's prefix cache."""
    source = resolve_model(settings.model)
    arch = source.architecture()
    tp = settings.tensor_parallel_size
    device = settings.device
    max_len = settings.max_model_len or arch.max_position_embeddings
    if max_len is None:
        raise EstimateError(f"{arch.source}: no max_position_embeddings; give --max-model-len")
    block_size = settings.block_size or DEFAULT_BLOCK_SIZE[device]
    total_bytes, gpu_name = gpu_total(settings.gpu_memory_bytes, settings.gpu)
    if device == "gpu" and total_bytes is None and settings.kv_cache_memory_bytes is None:
        raise ConfigError("a GPU estimate needs the GPU's memory: give --gpu NAME or --gpu-memory-gib N (or --kv-cache-memory-bytes)")
    default_tokens, default_seqs = default_batch(device, total_bytes, gpu_name, tp)
    batched = settings.max_num_batched_tokens or default_tokens
    seqs = settings.max_num_seqs or default_seqs
    async_on = settings.async_scheduling if settings.async_scheduling is not None else device == "gpu"

    weights = _weights(settings, arch, source)
    checkpoint = source.checkpoint()
    working = working_memory(
        arch, tp=tp, max_num_batched_tokens=batched, max_num_seqs=seqs,
        enforce_eager=settings.enforce_eager, device=device, model=settings.working,
    )  # fmt: skip
    layout = pool_layout(
        arch, tp=tp, kv_cache_dtype=settings.kv_cache_dtype, block_size=block_size,
        in_flight_tokens=batched * (2 if async_on else 1),
    )  # fmt: skip

    estimates = []
    if weights.source == "config":
        estimates.append(f"weights: parameter count from config.json x dtype bytes ({source.why_no_checkpoint()})")
    budget: Budget | None = None
    if device == "gpu" and total_bytes is not None:
        budget = gpu_budget(
            total_bytes=total_bytes,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            weights_bytes=weights.per_gpu_bytes,
            working=working,
            kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        )
        available = budget.available_kv_bytes
    elif settings.kv_cache_memory_bytes is not None:
        available = settings.kv_cache_memory_bytes
    elif device == "cpu" and total_bytes is not None:
        # The CPU backend reserves gpu_memory_utilization x the memory it is given for KV.
        available = math.floor(total_bytes * settings.gpu_memory_utilization)
        estimates.append("kv pool: gpu_memory_utilization x the given memory, as the CPU backend auto-sizes it")
    else:
        available = None

    pool = size_pool(layout, available or 0, max_len)
    working_uncertainty = int(settings.working.uncertainty_fraction * working.total_bytes + settings.working.uncertainty_gib * GIB) + (
        int(0.05 * weights.per_gpu_bytes) if weights.source == "config" else 0
    )
    explicit_pool = settings.kv_cache_memory_bytes is not None
    heads = arch.num_attention_heads
    if heads % tp:
        verdict = fit.refused(
            "heads_not_divisible", f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."
        )
    elif arch.max_position_embeddings and max_len > arch.max_position_embeddings:
        verdict = fit.refused(
            "max_model_len_too_long",
            f"max_model_len {max_len} is greater than the model's max_position_embeddings {arch.max_position_embeddings}",
        )
    elif available is None:
        verdict = fit.unknown("the CPU pool size is unknown: give --kv-cache-memory-bytes (or the node memory)")
    else:
        verdict = fit.verdict(
            layout=layout,
            available_kv_bytes=available,
            max_model_len=max_len,
            uncertainty_bytes=0 if explicit_pool else working_uncertainty,
            search_upper=arch.max_position_embeddings or max_len,
            headroom_bytes=budget.headroom_bytes if (budget is not None and explicit_pool) else None,
            headroom_uncertainty_bytes=working_uncertainty,
        )

    corpus = None
    if request_tokens:
        hashes = prompt_hashes(layout.block_size) if prompt_hashes is not None else None
        corpus = {**(corpus_info or {}), **corpus_concurrency(layout, pool, request_tokens, hashes).to_dict()}
        estimates.append("corpus: prompt tokens estimated as UTF-8 bytes / 4")

    return Estimate(
        model=ModelFacts(
            path=settings.model,
            config=arch.source,
            revision=source.revision,
            model_type=arch.model_type,
            num_layers=arch.num_layers,
            num_attention_heads=heads,
            num_kv_heads=arch.num_kv_heads,
            kv_heads_per_rank=arch.kv_heads_per_rank(tp),
            head_dim=arch.head_dim_k,
            mla=arch.mla,
            layer_kinds=arch.layer_counts(),
            sliding_window=arch.sliding_window,
            dtype=arch.dtype,
            max_position_embeddings=arch.max_position_embeddings,
        ),
        settings=SettingsUsed(
            device=device,
            gpu=gpu_name,
            gpu_memory_bytes=total_bytes,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=tp,
            max_model_len=max_len,
            kv_cache_dtype=settings.kv_cache_dtype,
            block_size=block_size,
            kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
            max_num_batched_tokens=batched,
            max_num_seqs=seqs,
            enforce_eager=settings.enforce_eager,
            working_memory_model=settings.working,
        ),
        weights=WeightsFacts.copied(
            weights,
            exact=weights.source == "safetensors",
            lower_bound=True,
            read_from=checkpoint.read_from if checkpoint is not None else "config.json",
        ),
        kv_bytes_per_token=arch.kv_bytes_per_token(tp, settings.kv_cache_dtype),
        kv_bytes_per_token_per_layer=arch.kv_bytes_per_token_per_layer(tp, settings.kv_cache_dtype),
        layout=_layout_facts(layout),
        budget=_budget_facts(budget, pool) if budget is not None else None,
        kv_pool=PoolFacts.copied(pool, max_concurrency=round(pool.max_concurrency, 4)) if available is not None else None,
        kv_cache_tokens=pool.kv_cache_tokens if available is not None else None,
        max_concurrency=round(pool.max_concurrency, 4) if available is not None else None,
        corpus=corpus,
        verdict=verdict,
        estimates=estimates,
    )
