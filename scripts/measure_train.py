"""One real training step of a Llama-shaped model, and the memory PyTorch holds for it.

    python scripts/measure_train.py --cases CASES.json --out RESULTS.json

Runs in vLLM's (or a training) environment, which has torch and transformers; the planner's own
dependencies are not there, so the module level imports only the standard library and no planner
module (like the tiny-model builder). `planner measure-train` and the e2e tests write the cases
file and read the results; see planner/estimate/train.py for the estimate they are compared with.

Each case builds a model (random weights from a config, or a model folder's own weights), applies
the precision policy, the trainable set (full, frozen layers, LoRA) and activation checkpointing,
runs one forward and backward on a random batch and one optimizer step, and records:

    weights_bytes           bytes of the model's parameter tensors (a rank's shard under FSDP)
    master_weights_bytes    the fp32 master copy of the trainable parameters (bf16-mixed)
    gradients_bytes         bytes of every parameter's .grad after optimizer.step()
    optimizer_bytes         bytes of every tensor in optimizer.state after the step
    saved_activations_bytes bytes saved for backward in the forward pass, counted through
                            torch.autograd.graph.saved_tensors_hooks, each storage once and the
                            parameters' own storages left out
    cuda_max_allocated_bytes / cuda_max_reserved_bytes   torch.cuda.max_memory_* over the step,
                            on a CUDA device only (null, with `cuda_note`, elsewhere); on CUDA
                            the measured step is the second (`warmup_steps` 1), whose peak holds
                            the optimizer state the first step created, as every later step does
    process_max_rss_bytes   the process's peak resident memory (a CPU figure)

Cases with "strategy": "fsdp" run on "workers" processes (gloo on CPU, NCCL on CUDA) with
PyTorch's fully_shard on every decoder layer and the root; rank 0's shard is reported. The FSDP
cases of one world size share one set of worker processes (starting them is the slow part).

The mixed policy is bf16 weights and gradients with an fp32 master copy the optimizer updates
(the layout of DeepSpeed's and Megatron's bf16 optimizers): after backward each gradient is cast
to fp32 on the master, the optimizer steps the master, the master is copied back to the weights,
and the fp32 gradient is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

CASE_KEYS = {
    "name", "config", "model", "load_weights", "precision", "optimizer", "micro_batch", "seq_len",
    "checkpointing", "checkpoint_every", "lora_rank", "lora_alpha", "lora_targets", "freeze_layers",
    "strategy", "workers", "device", "seed",
}  # fmt: skip
DEFAULTS: dict[str, Any] = {
    "config": None, "model": None, "load_weights": True, "precision": "bf16-mixed", "optimizer": "adamw",
    "micro_batch": 1, "seq_len": 128, "checkpointing": "none", "checkpoint_every": 2, "lora_rank": None,
    "lora_alpha": None, "lora_targets": ["q_proj", "v_proj"], "freeze_layers": 0, "strategy": "single",
    "workers": 1, "device": "auto", "seed": 0,
}  # fmt: skip
CUDA_NOTE = "peak CUDA memory needs a CUDA GPU: torch.cuda.max_memory_allocated/reserved were not measured"


class CaseError(Exception):
    pass


def normalise(case: dict[str, Any], index: int) -> dict[str, Any]:
    unknown = sorted(set(case) - CASE_KEYS)
    if unknown:
        raise CaseError(f"case {index}: unknown key(s) {unknown}; valid: {sorted(CASE_KEYS)}")
    full = {**DEFAULTS, "name": f"case-{index}", **case}
    if (full["config"] is None) == (full["model"] is None):
        raise CaseError(f"case {index} ({full['name']}): give exactly one of config (a config.json dict) or model (a folder)")
    return full


# --- the model -------------------------------------------------------------------------------


def build_model(case: dict[str, Any], dtype: Any, device: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(case["seed"])
    if case["model"] is not None:
        folder = Path(case["model"])
        has_weights = any(folder.glob("*.safetensors"))
        if case["load_weights"] and has_weights:
            return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
        config = AutoConfig.from_pretrained(folder)
    else:
        raw = dict(case["config"])
        config = AutoConfig.for_model(raw.pop("model_type", "llama"), **raw)
    config.use_cache = False
    # Random weights are drawn where the step runs: a GPU draws an 8B model's in seconds, where the
    # two CPU threads this script keeps take minutes.
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def lora_linear_class() -> Any:
    """A LoRA adapter (Hu et al. 2021) on a frozen nn.Linear, as peft builds it with dropout 0:
    y = base(x) + B(A(x)) x alpha / r, A of r x in, B of out x r (zeros), both trainable."""
    from torch import nn

    class LoraLinear(nn.Module):
        def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
            super().__init__()
            self.base = base
            base.weight.requires_grad_(False)
            if base.bias is not None:
                base.bias.requires_grad_(False)
            kw = {"dtype": base.weight.dtype, "device": base.weight.device}
            self.lora_A = nn.Linear(base.in_features, rank, bias=False, **kw)
            self.lora_B = nn.Linear(rank, base.out_features, bias=False, **kw)
            nn.init.zeros_(self.lora_B.weight)
            self.scaling = alpha / rank

        def forward(self, x: Any) -> Any:
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling

    return LoraLinear


def apply_trainable_set(model: Any, case: dict[str, Any]) -> None:
    layers = model.model.layers
    if case["lora_rank"]:
        for p in model.parameters():
            p.requires_grad_(False)
        LoraLinear = lora_linear_class()
        targets = set(case["lora_targets"])
        found = set()
        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if child_name in targets and child.__class__.__name__ == "Linear":
                    rank = case["lora_rank"]
                    setattr(module, child_name, LoraLinear(child, rank, case["lora_alpha"] or 2 * rank))
                    found.add(child_name)
        missing = targets - found
        if missing:
            raise CaseError(f"{case['name']}: LoRA target module(s) {sorted(missing)} are not Linear layers of this model")
    frozen = case["freeze_layers"]
    if frozen:
        model.model.embed_tokens.weight.requires_grad_(False)
        for layer in layers[:frozen]:
            for p in layer.parameters():
                p.requires_grad_(False)


def apply_checkpointing(model: Any, case: dict[str, Any]) -> None:
    mode = case["checkpointing"]
    if mode == "none":
        return
    # Non-reentrant, as PyTorch recommends: it works when a layer's input does not require grad
    # (frozen embeddings under LoRA) and saves only the layer's input for backward.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "selective":
        every = case["checkpoint_every"]
        for i, layer in enumerate(model.model.layers):
            layer.gradient_checkpointing = i % every == 0
    elif mode != "full":
        raise CaseError(f"{case['name']}: checkpointing {mode!r}; valid: none, selective, full")


def make_optimizer(name: str, params: list[Any]) -> Any:
    import torch

    match name:
        case "adamw":
            return torch.optim.AdamW(params, lr=1e-4)
        case "sgd":
            return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
        case "adafactor":
            return torch.optim.Adafactor(params, lr=1e-4)
        case "adamw8bit":
            try:
                import bitsandbytes as bnb
            except ImportError:
                raise CaseError("optimizer adamw8bit needs bitsandbytes, which this environment lacks") from None
            return bnb.optim.AdamW8bit(params, lr=1e-4)
    raise CaseError(f"optimizer {name!r}; valid: adamw, sgd, adafactor, adamw8bit")


# --- measuring -------------------------------------------------------------------------------


def tensor_bytes(t: Any) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _storage_ptr(t: Any) -> int | None:
    # FSDP's sharded parameters are DTensors whose Python storage cannot be read; their local
    # shard's can, and a freed (resized to 0) storage has none at all.
    local = t.to_local() if hasattr(t, "to_local") else t
    try:
        return local.untyped_storage().data_ptr()
    except RuntimeError:
        return None


class SavedTensors:
    """Bytes saved for backward, each storage counted once, the parameters' storages left out."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.storages: dict[int, int] = {}
        self.calls = 0

    def pack(self, t: Any) -> Any:
        self.calls += 1
        # Read the parameters now, not before forward: FSDP registers unsharded ones during it.
        params = {_storage_ptr(p) for p in self.model.parameters()}
        storage = t.untyped_storage()
        ptr = _storage_ptr(t)
        if ptr is not None and ptr not in params and storage.nbytes():
            self.storages[ptr] = max(self.storages.get(ptr, 0), storage.nbytes())
        return t

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


def one_step(case: dict[str, Any], device: Any, rank: int = 0, world: int = 1) -> dict[str, Any]:
    import torch
    from torch.autograd.graph import saved_tensors_hooks

    precision = case["precision"]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-mixed": torch.bfloat16}.get(precision)
    if dtype is None:
        raise CaseError(f"{case['name']}: precision {precision!r}; valid: fp32, bf16-mixed, bf16")
    model = build_model(case, dtype, device).to(device)
    apply_trainable_set(model, case)
    apply_checkpointing(model, case)
    model.train()
    if case["strategy"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise CaseError(f"{case['name']}: nothing trains (every parameter is frozen)")
    masters = [p.detach().float().clone() for p in trainable] if precision == "bf16-mixed" else None
    optimizer = make_optimizer(case["optimizer"], masters if masters is not None else trainable)

    generator = torch.Generator().manual_seed(case["seed"] + rank)
    vocab = model.config.vocab_size
    shape = (case["micro_batch"], case["seq_len"])
    input_ids = torch.randint(0, vocab, shape, generator=generator).to(device)

    def train_step(saved: SavedTensors | None = None) -> Any:
        hooks = saved_tensors_hooks(saved.pack, lambda t: t) if saved is not None else contextlib.nullcontext()
        with hooks:
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        if masters is not None:
            for p, m in zip(trainable, masters, strict=True):
                m.grad = p.grad.float()
        optimizer.step()
        if masters is not None:
            with torch.no_grad():
                for p, m in zip(trainable, masters, strict=True):
                    p.copy_(m)
                    m.grad = None
        return loss

    warmup_steps = 0
    if device.type == "cuda":
        # The first step creates the optimizer state only after backward has freed the saved
        # activations; every later step of a run holds both, so the peak a run lives with is the
        # second step's. The gradients are freed in between, as a training loop's zero_grad does.
        train_step()
        model.zero_grad(set_to_none=True)
        warmup_steps = 1
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)

    saved = SavedTensors(model)
    loss = train_step(saved)
    saved_bytes = saved.nbytes

    measured = {
        "parameters": sum(tensor_bytes(p) // p.element_size() for p in model.parameters()),
        "trainable_parameters": sum(tensor_bytes(p) // p.element_size() for p in trainable),
        "weights_bytes": sum(tensor_bytes(p) for p in model.parameters()),
        "master_weights_bytes": sum(tensor_bytes(m) for m in masters) if masters is not None else 0,
        "gradients_bytes": sum(tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None),
        "optimizer_bytes": sum(
            tensor_bytes(v) for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
        ),
        "saved_activations_bytes": saved_bytes,
        "saved_tensor_storages": len(saved.storages),
        "warmup_steps": warmup_steps,
        "loss": float(loss.detach().float().to_local() if hasattr(loss, "to_local") else loss.detach().float()),
    }
    if device.type == "cuda":
        torch.cuda.synchronize()
        measured["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        measured["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        measured["cuda_device"] = torch.cuda.get_device_name(device)
    else:
        measured["cuda_max_allocated_bytes"] = None
        measured["cuda_max_reserved_bytes"] = None
        measured["cuda_note"] = CUDA_NOTE
    # Linux reports ru_maxrss in KiB.
    measured["process_max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return measured


def pick_device(wanted: str) -> Any:
    import torch

    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise CaseError("device cuda was asked for but torch sees no CUDA device (torch.cuda.is_available() is False)")
    return torch.device(wanted)


def _fsdp_worker(rank: int, world: int, cases: list[dict[str, Any]], init_file: str, out_dir: str) -> None:
    """One rank: every FSDP case of this world size in turn, in one process group."""
    import torch
    import torch.distributed as dist

    device = pick_device(cases[0]["device"])
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = []
    try:
        for case in cases:
            try:
                results.append({"rank": rank, "world_size": world, "backend": backend, **one_step(case, device, rank, world)})
            except Exception as exc:  # reported to the parent, which fails the case with it
                results.append({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def run_fsdp(cases: list[dict[str, Any]], world: int) -> list[dict[str, Any] | CaseError]:
    """FSDP cases of one world size, in one set of worker processes: rank 0's figures, or the error."""
    import torch.multiprocessing as mp

    if world < 2:
        return [CaseError(f"{c['name']}: strategy fsdp needs workers >= 2, got {world}") for c in cases]
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_fsdp_worker, args=(world, cases, init_file, tmp), nprocs=world, join=True)
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    out: list[dict[str, Any] | CaseError] = []
    for i, case in enumerate(cases):
        ranks = [results[i] for results in per_rank]
        errors = [r["error"] for r in ranks if "error" in r]
        if errors:
            out.append(CaseError(f"{case['name']}: FSDP worker failed: {errors[0]}"))
            continue
        first = ranks[0]
        first["ranks"] = [{k: r[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes")} for r in ranks]
        out.append(first)
    return out


def run_all(cases: list[dict[str, Any]]) -> list[dict[str, Any] | CaseError]:
    """Every case's figures (or its error), in order: single ones here, FSDP ones grouped by world size."""
    outcomes: dict[int, dict[str, Any] | CaseError] = {}
    fsdp: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        if case["strategy"] == "fsdp":
            fsdp.setdefault(case["workers"], []).append(i)
        elif case["strategy"] != "single":
            outcomes[i] = CaseError(f"{case['name']}: strategy {case['strategy']!r}: measure single (one DDP replica) or fsdp")
        else:
            try:
                outcomes[i] = one_step(case, pick_device(case["device"]))
            except CaseError as exc:
                outcomes[i] = exc
    for world, indices in fsdp.items():
        for i, outcome in zip(indices, run_fsdp([cases[i] for i in indices], world), strict=True):
            outcomes[i] = outcome
    return [outcomes[i] for i in range(len(cases))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, type=Path, help='JSON file: {"cases": [{...}, ...]}')
    parser.add_argument("--out", required=True, type=Path, help="results JSON, written when every case has run")
    args = parser.parse_args(argv)
    try:
        cases = [normalise(c, i) for i, c in enumerate(json.loads(args.cases.read_text())["cases"])]
    except (OSError, ValueError, KeyError, TypeError, CaseError) as exc:
        print(f"measure_train: {args.cases}: {exc}", file=sys.stderr)
        return 2

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    results = []
    for case, outcome in zip(cases, run_all(cases), strict=True):
        failed = isinstance(outcome, CaseError)
        results.append({"name": case["name"], "case": case, "measured": None if failed else outcome, "error": str(outcome) if failed else None})
    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
        "results": results,
    }
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=2))
    os.replace(tmp, args.out)
    failed = [r["name"] for r in results if r["error"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
