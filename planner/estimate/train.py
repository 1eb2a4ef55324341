"""The memory budget of one fine-tuning step per GPU: `planner estimate --train`.

    weights (+ fp32 master)  train_states: precision policy, trainable set, sharding
    gradients                train_states
    optimizer state          train_states: AdamW, SGD with momentum, Adafactor, 8-bit AdamW
    saved activations        train_activations: one micro-batch, checkpointing, LoRA, TP
    temporary buffers        see `temporaries` below (a labelled estimate, not checked on CPU): the
                             larger of the backward pass's and the optimizer step's
    framework reserve        CUDA context, NCCL buffers when there is more than one GPU, reserve

Gradients and saved activations are counted together: with gradient accumulation the gradients
of earlier micro-batches are held while the next one runs forward, and without it the peak is a
little lower. Gradient accumulation changes the time per optimizer step, not the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import EstimateError
from planner.estimate.architecture import Architecture
from planner.estimate.model_source import resolve_model
from planner.estimate.plan import gpu_total
from planner.estimate.train_activations import Activations, Checkpointing, saved_activations
from planner.estimate.train_params import Param, inventory, trainable_set
from planner.estimate.train_states import SHARDED, WEIGHT_BYTES, ModelStates, Optimizer, Precision, Strategy, model_states
from planner.estimate.units import GIB, format_bytes

DEFAULT_SEQ_LEN = 2048
# peft's default LoRA targets for Llama-family models (q_proj and v_proj).
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")
SUGGESTED_LORA_RANK = 16


class TrainReserve(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cuda_context_gib: float = Field(0.5, ge=0, description="CUDA context and library workspaces per GPU")
    nccl_gib: float = Field(1.75, ge=0, description="NCCL buffers per GPU when more than one GPU takes part")
    reserve_gib: float = Field(0.0, ge=0, description="extra reserve for allocator fragmentation")


class TrainSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    gpu: str | None = None
    gpu_memory_bytes: int | None = Field(None, gt=0)
    optimizer: Optimizer = "adamw"
    precision: Precision = "bf16-mixed"
    micro_batch: int = Field(1, ge=1)
    seq_len: int | None = Field(None, ge=1)
    grad_accum: int = Field(1, ge=1)
    checkpointing: Checkpointing = "none"
    checkpoint_every: int = Field(2, ge=1)
    lora_rank: int | None = Field(None, ge=1)
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    freeze_layers: int = Field(0, ge=0)
    strategy: Strategy = "single"
    data_parallel: int = Field(1, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    reserve: TrainReserve = Field(default_factory=TrainReserve)

    @model_validator(mode="after")
    def _consistent(self) -> TrainSettings:
        if self.strategy == "single" and self.data_parallel != 1:
            raise ValueError(f"strategy single runs on one data-parallel worker; --gpus {self.data_parallel} needs ddp, zero1-3 or fsdp")
        if self.lora_rank and self.freeze_layers:
            raise ValueError("--lora-rank and --freeze-layers are two trainable sets; give one")
        if not self.lora_targets:
            raise ValueError("--lora-targets is empty; name Linear modules, e.g. q_proj,v_proj")
        return self


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TrainBudget(_Section):
    """Bytes on one GPU."""

    weights_bytes: int
    master_weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    model_states_bytes: int
    activations_bytes: int
    # The larger of the two phases' extra: backward's temporaries, or the step's less the
    # activations it no longer holds (see `temporaries`).
    temporary_bytes: int
    backward_temporary_bytes: int
    step_temporary_bytes: int
    framework_bytes: int
    total_bytes: int
    gpu_bytes: int | None
    headroom_bytes: int | None


class ActivationFacts(_Section):
    micro_batch: int
    seq_len: int
    tokens: int
    layers_bytes: int
    model_bytes: int
    checkpointed_layers: int
    recomputed_layer_bytes: int


class ParameterFacts(_Section):
    total: int
    trainable: int
    lora: int
    source: str


class Suggestion(_Section):
    change: str
    total_bytes: int
    fits: bool | None


class TrainVerdict(_Section):
    status: Literal["fits", "does_not_fit", "unknown"]
    missing_bytes: int | None
    largest_micro_batch: int | None
    largest_seq_len: int | None
    suggestions: list[Suggestion]
    message: str


class TrainEstimate(_Section):
    """`planner estimate --train --json` prints its model_dump(mode="json")."""

    model: str
    # The Hub commit the model was read at; None for a local folder.
    revision: str | None = None
    model_type: str
    settings: dict
    gpus: int
    effective_batch: int
    parameters: ParameterFacts
    per_gpu: TrainBudget
    activations: ActivationFacts
    verdict: TrainVerdict
    estimates: list[str]


def _check_shape(arch: Architecture) -> None:
    if arch.mla or arch.moe is not None:
        what = "MLA attention" if arch.mla else "a mixture of experts"
        raise EstimateError(f"{arch.source}: the training estimate models dense decoders (Llama, Mistral, Qwen2 shapes), not {what}")
    if arch.vocab_size is None or arch.intermediate_size is None:
        raise EstimateError(f"{arch.source}: a training estimate needs vocab_size and intermediate_size")


@dataclass(frozen=True)
class Temporaries:
    """Buffers that live for part of the step, on top of what is held throughout (an estimate)."""

    # Forward and backward, while the saved activations are alive.
    backward_bytes: int
    # The optimizer step, after backward has freed the saved activations.
    step_bytes: int

    def peak_extra(self, activations_bytes: int) -> int:
        """What the larger of the two phases adds on top of the model states and the activations."""
        return max(self.backward_bytes, self.step_bytes - activations_bytes, 0)


def temporaries(arch: Architecture, settings: TrainSettings, states: ModelStates, acts: Activations, seq_len: int, params: list[Param]) -> Temporaries:
    """Forward and backward:

    - the logits: the LM head's output (e T V) stays referenced by the model's output, and the
      loss backward holds the fp32 gradient of the log-probabilities and of the logits (2 x 4 T V)
    - backward works through one layer at a time: its activation gradients, about one layer's
      saved bytes, and with checkpointing that layer recomputed as well
    - DDP's gradient buckets, a second copy of the gradients unless gradient_as_bucket_view
      (torch.nn.parallel.DistributedDataParallel's documentation); they live through the step too
    - ZeRO-3/FSDP gathers one layer's full weights for compute and prefetches the next (2 layers)

    The optimizer step:

    - bf16-mixed casts the gradients to fp32 for the master step (4 bytes per trainable element
      of the worker's shard)
    - AdamW's multi-tensor (foreach) step, PyTorch's default on CUDA, computes sqrt(exp_avg_sq)
      for the whole parameter group at once: one more copy of the second moment
    """
    tp = settings.tensor_parallel_size
    e = WEIGHT_BYTES[settings.precision]
    tokens = settings.micro_batch * seq_len
    vocab = math.ceil(int(arch.vocab_size or 0) / tp)
    backward = tokens * vocab * (e + 8)
    layer = acts.largest_layer_bytes
    backward += 2 * layer if acts.checkpointed_layers else layer
    buckets = states.gradients_bytes if settings.strategy == "ddp" and settings.data_parallel > 1 else 0
    backward += buckets
    if "weights" in SHARDED[settings.strategy] and settings.data_parallel > 1:
        per_layer = max(
            (sum(p.per_rank(tp, arch.num_kv_heads) for p in params if p.layer == i) for i in range(arch.num_layers)), default=0
        )
        backward += 2 * per_layer * e
    step = buckets + (states.master_weights_bytes if settings.precision == "bf16-mixed" else 0)
    if settings.optimizer == "adamw":
        step += states.optimizer_bytes // 2
    return Temporaries(backward_bytes=backward, step_bytes=step)


def _budget(arch: Architecture, settings: TrainSettings, params: list[Param], seq_len: int, total_gpu: int | None) -> tuple[TrainBudget, Activations]:
    tp = settings.tensor_parallel_size
    states = model_states(
        params, precision=settings.precision, optimizer=settings.optimizer, strategy=settings.strategy,
        data_parallel=settings.data_parallel, tp=tp, num_kv_heads=arch.num_kv_heads,
    )  # fmt: skip
    acts = saved_activations(
        arch, params, micro_batch=settings.micro_batch, seq_len=seq_len, dtype_bytes=WEIGHT_BYTES[settings.precision],
        checkpointing=settings.checkpointing, checkpoint_every=settings.checkpoint_every, tp=tp,
    )  # fmt: skip
    temp = temporaries(arch, settings, states, acts, seq_len, params)
    temps = temp.peak_extra(acts.total_bytes)
    r = settings.reserve
    many = settings.data_parallel * tp > 1
    framework = math.ceil((r.cuda_context_gib + (r.nccl_gib if many else 0.0) + r.reserve_gib) * GIB)
    total = states.total_bytes + acts.total_bytes + temps + framework
    return TrainBudget(
        weights_bytes=states.weights_bytes,
        master_weights_bytes=states.master_weights_bytes,
        gradients_bytes=states.gradients_bytes,
        optimizer_bytes=states.optimizer_bytes,
        model_states_bytes=states.total_bytes,
        activations_bytes=acts.total_bytes,
        temporary_bytes=temps,
        backward_temporary_bytes=temp.backward_bytes,
        step_temporary_bytes=temp.step_bytes,
        framework_bytes=framework,
        total_bytes=total,
        gpu_bytes=total_gpu,
        headroom_bytes=None if total_gpu is None else total_gpu - total,
    ), acts


def _largest(fits, upper: int) -> int | None:
    """The largest n in 1..upper with fits(n), for a fits() that only turns False as n grows."""
    if not fits(1):
        return None
    lo, hi = 1, 1
    while hi < upper and fits(hi):
        lo, hi = hi, min(upper, hi * 2)
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _params(settings: TrainSettings, arch: Architecture, shapes: list[tuple[str, tuple[int, ...]]]) -> list[Param]:
    return trainable_set(
        shapes, num_layers=arch.num_layers, freeze_layers=settings.freeze_layers,
        lora_rank=settings.lora_rank, lora_targets=settings.lora_targets,
    )  # fmt: skip


MAX_FSDP_GPUS = 1024


def _fewest_fsdp_gpus(arch: Architecture, settings: TrainSettings, shapes, seq_len: int, total_gpu: int) -> int | None:
    """The fewest data-parallel GPUs (a power of two up to MAX_FSDP_GPUS) on which FSDP fits."""
    gpus = 2
    while gpus <= MAX_FSDP_GPUS:
        changed = settings.model_copy(update={"strategy": "fsdp", "data_parallel": gpus})
        if _budget(arch, changed, _params(changed, arch, shapes), seq_len, total_gpu)[0].total_bytes <= total_gpu:
            return gpus
        gpus *= 2
    return None


def _suggestions(arch: Architecture, settings: TrainSettings, shapes, seq_len: int, total_gpu: int) -> list[Suggestion]:
    """Single changes to try, each with the per-GPU total it would give."""
    variants: list[tuple[str, dict]] = []
    if settings.checkpointing != "full":
        variants.append(("activation checkpointing on every layer (--checkpointing full)", {"checkpointing": "full"}))
    for extra, label in (({}, ""), ({"checkpointing": "full"}, " with --checkpointing full")):
        if extra and settings.checkpointing == "full":
            continue
        gpus = _fewest_fsdp_gpus(arch, settings.model_copy(update=extra), shapes, seq_len, total_gpu)
        if gpus is not None and (gpus, settings.strategy) != (settings.data_parallel, "fsdp"):
            variants.append((f"FSDP over {gpus} GPUs (--strategy fsdp --gpus {gpus}{label})", {"strategy": "fsdp", "data_parallel": gpus, **extra}))
    if settings.lora_rank is None:
        variants.append(
            (f"LoRA rank {SUGGESTED_LORA_RANK} on q_proj,v_proj (--lora-rank {SUGGESTED_LORA_RANK})", {"lora_rank": SUGGESTED_LORA_RANK, "freeze_layers": 0})
        )
    if settings.optimizer == "adamw":
        variants.append(("8-bit AdamW (--optimizer adamw8bit, bitsandbytes)", {"optimizer": "adamw8bit"}))
    out = []
    for change, update in variants:
        changed = settings.model_copy(update=update)
        budget, _ = _budget(arch, changed, _params(changed, arch, shapes), seq_len, total_gpu)
        out.append(Suggestion(change=change, total_bytes=budget.total_bytes, fits=budget.total_bytes <= total_gpu))
    return out


def train_estimate(settings: TrainSettings) -> TrainEstimate:
    model = resolve_model(settings.model)
    arch = model.architecture()
    _check_shape(arch)
    tp = settings.tensor_parallel_size
    if arch.num_attention_heads % tp:
        raise EstimateError(f"--tensor-parallel-size {tp}: the model's {arch.num_attention_heads} attention heads do not split evenly")
    seq_len = settings.seq_len or min(DEFAULT_SEQ_LEN, arch.max_position_embeddings or DEFAULT_SEQ_LEN)
    if arch.max_position_embeddings and seq_len > arch.max_position_embeddings:
        raise EstimateError(f"--seq-len {seq_len} is longer than the model's max_position_embeddings {arch.max_position_embeddings}")
    shapes, source = inventory(model, arch)
    params = _params(settings, arch, shapes)
    total_gpu, gpu_name = gpu_total(settings.gpu_memory_bytes, settings.gpu)
    budget, acts = _budget(arch, settings, params, seq_len, total_gpu)

    estimates = [
        "temporary buffers (logits and their gradients, one layer's backward, communication buffers, the optimizer step's) are an estimate; "
        "the model states and saved activations were checked against PyTorch on CPU and on an H200 (docs/guides/memory.md; fp32 attention on CUDA keeps more)",
    ]
    if source == "config":
        estimates.append("parameters: Llama-named shapes from config.json (no safetensors found)")
    if settings.optimizer == "adamw8bit":
        estimates.append("8-bit AdamW: bitsandbytes' published state layout, not measured here")
    if tp > 1:
        estimates.append("tensor parallelism: weights and attention/MLP activations split Megatron-style, not measured here")
    if settings.precision == "fp32":
        plain = arch.num_layers - acts.checkpointed_layers
        probs = settings.micro_batch * (arch.num_attention_heads // tp) * seq_len**2 * 4 * plain
        if probs:
            estimates.append(
                f"fp32 on a CUDA GPU: SDPA has no fp32 flash kernel and keeps the attention probabilities too, about {format_bytes(probs)} "
                f"({plain} layers not checkpointed x micro-batch x heads x seq-len^2 x 4 bytes), not counted above (docs/guides/memory.md: measured on an H200)"
            )

    if total_gpu is None:
        verdict = TrainVerdict(
            status="unknown", missing_bytes=None, largest_micro_batch=None, largest_seq_len=None, suggestions=[],
            message="give --gpu NAME or --gpu-memory-gib N for a verdict",
        )  # fmt: skip
    else:
        def fits_batch(b: int) -> bool:
            return _budget(arch, settings.model_copy(update={"micro_batch": b}), params, seq_len, total_gpu)[0].total_bytes <= total_gpu

        def fits_len(n: int) -> bool:
            return _budget(arch, settings, params, n, total_gpu)[0].total_bytes <= total_gpu

        largest_batch = _largest(fits_batch, 1 << 16)
        largest_len = _largest(fits_len, arch.max_position_embeddings or 1 << 20)
        fits = budget.total_bytes <= total_gpu
        suggestions = [] if fits else _suggestions(arch, settings, shapes, seq_len, total_gpu)
        if fits:
            message = f"fits, {format_bytes(total_gpu - budget.total_bytes)} to spare; largest micro-batch at seq-len {seq_len:,}: {largest_batch:,}"
        else:
            working = [s.change for s in suggestions if s.fits]
            if largest_batch:
                working.insert(0, f"micro-batch {largest_batch} (--micro-batch {largest_batch}, with --grad-accum to keep the batch)")
            message = f"does not fit: {format_bytes(budget.total_bytes - total_gpu)} missing; " + (
                "these fit: " + "; ".join(working) if working else "no single change fits: combine them (see suggestions)"
            )
        verdict = TrainVerdict(
            status="fits" if fits else "does_not_fit",
            missing_bytes=max(0, budget.total_bytes - total_gpu),
            largest_micro_batch=largest_batch,
            largest_seq_len=largest_len,
            suggestions=suggestions,
            message=message,
        )

    lora = sum(p.numel for p in params if p.kind == "lora")
    return TrainEstimate(
        model=settings.model,
        revision=model.revision,
        model_type=arch.model_type,
        settings={**settings.model_dump(mode="json"), "seq_len": seq_len, "gpu": gpu_name, "gpu_memory_bytes": total_gpu},
        gpus=settings.data_parallel * tp,
        effective_batch=settings.micro_batch * settings.grad_accum * settings.data_parallel,
        parameters=ParameterFacts(
            total=sum(p.numel for p in params), trainable=sum(p.numel for p in params if p.trains), lora=lora, source=source
        ),
        per_gpu=budget,
        activations=ActivationFacts(
            micro_batch=settings.micro_batch,
            seq_len=seq_len,
            tokens=settings.micro_batch * seq_len,
            layers_bytes=acts.layers_bytes,
            model_bytes=acts.model_bytes,
            checkpointed_layers=acts.checkpointed_layers,
            recomputed_layer_bytes=acts.largest_layer_bytes if acts.checkpointed_layers else 0,
        ),
        verdict=verdict,
        estimates=estimates,
    )
