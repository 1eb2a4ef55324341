"""`planner estimate --train`: the memory budget of a fine-tuning step per GPU.

The flags are shared with `planner measure-train`, which runs the same configuration for real.
"""

from __future__ import annotations

import argparse
import json
from typing import get_args

from planner.cliargs import comma_list, flag_values
from planner.errors import ConfigError
from planner.estimate.train import DEFAULT_LORA_TARGETS, DEFAULT_SEQ_LEN, TrainEstimate, TrainReserve, TrainSettings, train_estimate
from planner.estimate.train_activations import Checkpointing
from planner.estimate.train_states import Optimizer, Precision, Strategy
from planner.estimate.units import GIB, format_bytes
from planner.validation import build

OPTIMIZER_NAMES = {"adamw": "AdamW", "sgd": "SGD with momentum", "adafactor": "Adafactor", "adamw8bit": "8-bit AdamW"}
# Flags of the serving estimate that mean nothing for training, with their defaults.
SERVING_ONLY = {
    "max_model_len": None, "kv_cache_memory_bytes": None, "prompts": None, "max_num_batched_tokens": None,
    "max_num_seqs": None, "block_size": None, "kv_cache_dtype": "auto", "device": "gpu", "enforce_eager": False,
}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training (with --train; see planner/estimate/train.py)")
    g.add_argument("--optimizer", choices=get_args(Optimizer), default="adamw", help="default %(default)s")
    g.add_argument(
        "--precision", choices=get_args(Precision), default="bf16-mixed",
        help="fp32; bf16-mixed (bf16 weights and gradients, fp32 master copy and optimizer state); bf16 (pure). Default %(default)s",
    )  # fmt: skip
    g.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per forward (default %(default)s)")
    g.add_argument("--seq-len", type=int, default=None, help=f"tokens per sequence (default {DEFAULT_SEQ_LEN}, or the model's maximum if shorter)")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step: changes time, not the peak (default 1)")
    g.add_argument("--checkpointing", choices=get_args(Checkpointing), default="none", help="activation checkpointing (default %(default)s)")
    g.add_argument("--checkpoint-every", type=int, default=2, help="with --checkpointing selective: every Nth layer (default %(default)s)")
    g.add_argument("--lora-rank", type=int, default=None, help="train LoRA adapters of this rank instead of the weights")
    g.add_argument(
        "--lora-targets", type=comma_list(str, "module names"), default=list(DEFAULT_LORA_TARGETS),
        help=f"Linear modules that get adapters (default {','.join(DEFAULT_LORA_TARGETS)})",
    )  # fmt: skip
    g.add_argument("--freeze-layers", type=int, default=0, help="freeze the embeddings and the first N layers (default 0)")
    g.add_argument("--strategy", choices=get_args(Strategy), default="single", help="single, ddp, zero1-3 or fsdp (= zero3) (default %(default)s)")
    g.add_argument("--gpus", type=int, default=1, help="data-parallel workers for ddp/zero/fsdp; x --tensor-parallel-size GPUs in all (default 1)")


def settings_from(args: argparse.Namespace, tp: int, source: str) -> TrainSettings:
    reserve = build(TrainReserve, flag_values(args, "cuda_context_gib", "nccl_gib", "reserve_gib"), source=source)
    gib = None if args.gpu_memory_gib is None else float(args.gpu_memory_gib)
    return build(
        TrainSettings,
        flag_values(
            args,
            "gpu", "optimizer", "precision", "micro_batch", "seq_len", "grad_accum", "checkpointing",
            "checkpoint_every", "lora_rank", "freeze_layers", "strategy",
            model=str(args.model),
            gpu_memory_bytes=None if gib is None else int(gib * GIB),
            lora_targets=tuple(args.lora_targets),
            data_parallel=args.gpus,
            tensor_parallel_size=tp,
            reserve=reserve,
        ),
        source=source,
    )


def run(args: argparse.Namespace) -> int:
    given = [name for name, default in SERVING_ONLY.items() if getattr(args, name) != default]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"{flags}: serving flag(s) that --train does not use; the training flags are listed under `planner estimate --help`")
    results = [train_estimate(settings_from(args, tp, "planner estimate --train")) for tp in args.tensor_parallel_size]
    if args.json:
        print(json.dumps({"points": [r.model_dump(mode="json") for r in results]}, indent=2))
        return 0
    for i, result in enumerate(results):
        if i:
            print()
        print("\n".join(render(result)))
    return 0


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"


def trainable_label(s: dict, params) -> str:
    if s["lora_rank"]:
        return f"LoRA rank {s['lora_rank']} on {','.join(s['lora_targets'])} ({_count(params.trainable)} trainable of {_count(params.total)})"
    if s["freeze_layers"]:
        return f"first {s['freeze_layers']} layers frozen ({_count(params.trainable)} trainable of {_count(params.total)})"
    return f"full fine-tuning of {_count(params.total)} parameters"


def render(r: TrainEstimate) -> list[str]:
    """The text report of one training estimate; a pure function of it."""
    s, b, a, v = r.settings, r.per_gpu, r.activations, r.verdict
    where = s["gpu"] or (f"{s['gpu_memory_bytes'] / GIB:.2f} GiB GPU" if s["gpu_memory_bytes"] else "an unnamed GPU")
    layout = {"single": "1 GPU"}.get(s["strategy"], f"{s['strategy']} over {s['data_parallel']} GPUs")
    if s["tensor_parallel_size"] > 1:
        layout += f", tensor-parallel {s['tensor_parallel_size']}"
    checkpointing = s["checkpointing"] + (f" (every {s['checkpoint_every']} layers)" if s["checkpointing"] == "selective" else "")
    lines = [
        f"{r.model} ({r.model_type}), training on {where}: {layout}, {r.gpus} GPU(s) in all",
        f"{s['precision']} {OPTIMIZER_NAMES[s['optimizer']]}, {trainable_label(s, r.parameters)}",
        f"micro-batch {a.micro_batch} x seq-len {a.seq_len:,} = {a.tokens:,} tokens, grad-accum {s['grad_accum']} "
        f"(effective batch {r.effective_batch} sequences), checkpointing {checkpointing}",
    ]
    rows = [
        ("weights", b.weights_bytes),
        ("fp32 master weights", b.master_weights_bytes),
        ("gradients", b.gradients_bytes),
        ("optimizer state", b.optimizer_bytes),
        ("saved activations", b.activations_bytes),
        ("temporary buffers (estimate)", b.temporary_bytes),
        ("framework reserve", b.framework_bytes),
        ("total per GPU", b.total_bytes),
    ]
    if b.gpu_bytes is not None:
        rows += [("headroom left", b.headroom_bytes), ("GPU total", b.gpu_bytes)]
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {format_bytes(value):>12}" for label, value in rows]
    if v.largest_micro_batch is not None or v.largest_seq_len is not None:
        batch = f"{v.largest_micro_batch:,}" if v.largest_micro_batch else "none"
        length = f"{v.largest_seq_len:,}" if v.largest_seq_len else "none"
        lines.append(f"largest micro-batch at seq-len {a.seq_len:,}: {batch}; largest seq-len at micro-batch {a.micro_batch}: {length}")
    lines.append(f"verdict: {v.message}")
    for sug in v.suggestions:
        lines.append(f"  {'fits' if sug.fits else 'no  '}  {format_bytes(sug.total_bytes):>12}  {sug.change}")
    lines += [f"note: {note}" for note in r.estimates]
    return lines
