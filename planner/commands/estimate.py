"""`planner estimate`: what fits on a GPU, before any server is launched (`--train`: estimate_train.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from planner.cliargs import comma_list, env_default, flag_values
from planner.commands import estimate_train
from planner.estimate.architecture import CACHE_DTYPE_HELP
from planner.estimate.demand import corpus_prompt_hashes, corpus_request_tokens
from planner.estimate.fit import Verdict
from planner.estimate.gpu_catalog import CATALOG
from planner.estimate.memory import WorkingMemoryModel
from planner.estimate.plan import DEFAULT_GPU_MEMORY_UTILIZATION, Estimate, EstimateSettings, estimate
from planner.estimate.units import GIB, VALID_HELP, format_bytes
from planner.validation import build


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict weights, KV cache and concurrency for a model on a GPU, without launching anything",
        description=(
            "Pre-flight memory estimate: raw weights (a lower bound), KV bytes per token, working memory, "
            "the KV pool vLLM would allocate, its concurrency, and whether max_model_len fits."
        ),
    )
    p.add_argument(
        "--model", required=True,
        help="Hub name as for vllm serve (org/name or org/name@revision; HF_HOME, HF_TOKEN, HF_HUB_OFFLINE honoured), "
        "a local model folder (config.json + safetensors) or a config.json",
    )  # fmt: skip
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu", help="gpu (default), or cpu for vLLM's CPU build")
    p.add_argument("--gpu", default=env_default("PLANNER_GPU"), help=f"GPU from the catalogue: {', '.join(CATALOG)} (env PLANNER_GPU)")
    p.add_argument(
        "--gpu-memory-gib", type=float, default=env_default("PLANNER_GPU_MEMORY_GIB"),
        help="GPU memory in GiB as CUDA reports it; overrides --gpu's figure (env PLANNER_GPU_MEMORY_GIB)",
    )  # fmt: skip
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION, help="as vLLM's flag (default %(default)s)")
    p.add_argument(
        "--tensor-parallel-size", type=comma_list(int, "integers"), default=[1], metavar="N[,N...]",
        help="one estimate per value, e.g. 1,2,4 (default 1)",
    )  # fmt: skip
    p.add_argument("--max-model-len", default=None, help="default: the model's max_position_embeddings")
    p.add_argument("--kv-cache-dtype", default="auto", help=f"{CACHE_DTYPE_HELP} (default auto)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default 16 on GPU, 128 on CPU)")
    p.add_argument("--max-num-batched-tokens", default=None, help="default: vLLM's for the GPU's size")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: vLLM's for the GPU's size")
    p.add_argument("--kv-cache-memory-bytes", default=None, help=f"fixed KV pool as vLLM's flag: {VALID_HELP}")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (as vLLM's flag)")
    p.add_argument("--prompts", type=Path, default=None, help="corpus JSONL: add the corpus-aware concurrency")
    p.add_argument("--max-tokens", type=int, default=None, help="output length of corpus lines without max_tokens (default: to max-model-len)")
    model = p.add_argument_group("working-memory model (see planner/estimate/memory.py)")
    defaults = WorkingMemoryModel()
    model.add_argument("--reserve-gib", type=float, default=defaults.reserve_gib, help="extra reserve per GPU (default %(default)s)")
    model.add_argument("--cuda-graphs-gib", type=float, default=defaults.cuda_graphs_gib, help="CUDA graph pool per GPU (default %(default)s)")
    model.add_argument("--cuda-context-gib", type=float, default=defaults.cuda_context_gib, help="CUDA context per GPU (default %(default)s)")
    model.add_argument("--nccl-gib", type=float, default=defaults.nccl_gib, help="NCCL buffers per GPU at TP > 1 (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the full prediction as JSON")
    p.add_argument("--train", action="store_true", help="budget a fine-tuning step instead of serving (training flags below)")
    estimate_train.add_arguments(p)
    p.set_defaults(run=run)


def settings_for(args: argparse.Namespace, tp: int) -> EstimateSettings:
    working = build(
        WorkingMemoryModel,
        flag_values(args, "reserve_gib", "cuda_graphs_gib", "cuda_context_gib", "nccl_gib"),
        source="planner estimate",
    )
    gib = None if args.gpu_memory_gib is None else float(args.gpu_memory_gib)
    return build(
        EstimateSettings,
        flag_values(
            args,
            "device", "gpu", "gpu_memory_utilization", "max_model_len", "kv_cache_dtype", "block_size",
            "kv_cache_memory_bytes", "max_num_batched_tokens", "max_num_seqs", "enforce_eager",
            model=str(args.model),
            gpu_memory_bytes=None if gib is None else int(gib * GIB),
            tensor_parallel_size=tp,
            working=working,
        ),
        source="planner estimate",
    )


def run(args: argparse.Namespace) -> int:
    if args.train:
        return estimate_train.run(args)
    results = []
    for tp in args.tensor_parallel_size:
        settings = settings_for(args, tp)
        tokens = info = None
        if args.prompts is not None:
            first = estimate(settings)
            tokens, info = corpus_request_tokens(args.prompts, max_model_len=first.settings.max_model_len, default_max_tokens=args.max_tokens)
        hashes = (lambda size: corpus_prompt_hashes(args.prompts, size)) if args.prompts is not None else None
        results.append(estimate(settings, request_tokens=tokens, corpus_info=info, prompt_hashes=hashes))
    if args.json:
        print(json.dumps({"points": [r.model_dump(mode="json") for r in results]}, indent=2))
    else:
        for i, result in enumerate(results):
            if i:
                print()
            print("\n".join(render(result)))
    return 0


_gib = format_bytes


def render(r: Estimate) -> list[str]:
    """The text report of one estimate; a pure function of it."""
    m, s, w, v = r.model, r.settings, r.weights, r.verdict
    where = s.gpu or (f"{s.gpu_memory_bytes / GIB:.2f} GiB GPU" if s.gpu_memory_bytes else s.device.upper())
    at = f" at {m.revision[:12]}" if m.revision else ""
    lines = [
        f"{m.path}{at} ({m.model_type}), tensor-parallel {s.tensor_parallel_size} on {where}, "
        f"max-model-len {s.max_model_len:,}, kv-cache-dtype {s.kv_cache_dtype}, block {s.block_size}"
    ]
    read = f", {w.read_from}" if w.read_from and w.read_from != "local files" else ""
    how = f"exact: {w.tensors} tensors in {w.files} safetensors file(s){read}" if w.exact else f"estimate: {w.parameters / 1e9:.2f}B parameters from config.json"
    b = r.budget
    rows = [("weights per GPU, a lower bound (" + how + ")", w.per_gpu_bytes)]
    if b is not None:
        rows += [
            ("KV cache", b.kv_cache_bytes),
            ("activations and workspace", b.activations_and_workspace_bytes),
            ("CUDA graphs", b.cuda_graphs_bytes),
            ("framework and allocator reserve", b.framework_and_reserve_bytes),
            ("headroom left", b.headroom_bytes),
            ("GPU total", b.total_bytes),
        ]
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {_gib(value):>12}" for label, value in rows]
    heads = "1 latent head (MLA)" if m.mla else f"{m.kv_heads_per_rank} KV heads per rank"
    lines.append(f"KV bytes per token per GPU: {r.kv_bytes_per_token:,} ({m.num_layers} layers, {heads})")
    pool = r.kv_pool
    if pool is not None:
        lines.append(
            f"KV pool: {_gib(pool.bytes)} = {pool.num_blocks:,} blocks of {pool.block_size} tokens "
            f"({pool.usable_blocks:,} usable, 1 null block reserved), {r.kv_cache_tokens:,} tokens as vLLM reports them"
        )
        lines.append(f"max concurrency at {s.max_model_len:,} tokens per request: {pool.max_concurrency:.2f}x")
    c = r.corpus
    if c is not None:
        lines.append(
            f"corpus-aware concurrency (estimate; {c['token_counts']}): {c['concurrency']:.2f} "
            f"({c['requests']} requests, {c['mean_blocks_per_request']:.1f} blocks each on average)"
        )
        if c.get("concurrency_prefix_cache") is not None:
            lines.append(
                f"  with vLLM's prefix cache: {c['concurrency_prefix_cache']} ({c['shared_prefix_blocks']} shared"
                f" prompt blocks held once, {c['mean_own_blocks_per_request']:.1f} blocks of its own a request)"
            )
    lines.append("verdict: " + _verdict(v))
    lines += [f"note: {note}" for note in r.estimates]
    return lines


def _verdict(v: Verdict) -> str:
    if v.status == "unknown":
        return f"unknown: {v.message}"
    clear = "" if v.clear_margin else " (within the model's uncertainty)"
    if v.status == "fits":
        return f"fits, {_gib(v.margin_bytes)} to spare{clear}"
    if v.message:
        return f"does not fit ({v.reason}): {v.message}"
    largest = v.largest_fitting_max_model_len
    tail = f"; largest max-model-len that fits: {largest:,}" if largest else "; no max-model-len fits"
    return f"does not fit ({v.reason}): {_gib(v.missing_bytes)} missing{tail}{clear}"
