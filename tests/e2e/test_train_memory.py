"""The training estimate against what PyTorch holds for one real step on CPU.

Every case runs in one process of vLLM's environment (scripts/measure_train.py: Hugging Face's
LlamaForCausalLM, one forward, backward and optimizer step), FSDP's over two gloo workers; the
estimate must be within 5% on each model state and 15% on the saved activations. docs/guides/memory.md's
"Checked against PyTorch" table is this module's output (`-s` prints it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planner.commands.measure_train import run_script
from planner.estimate.train import TrainSettings, train_estimate
from planner.estimate.train_measure import compare, measure_case
from tests.e2e.support import REPO, TinyModel

pytestmark = pytest.mark.e2e

WIDE = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
}  # fmt: skip
# Multi-head attention (no GQA), head_dim 64 and tied embeddings.
WIDER = {
    "model_type": "llama", "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 6,
    "num_key_value_heads": 6, "head_dim": 64, "vocab_size": 2048, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}  # fmt: skip
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# (name, model: "tiny" or a config above, settings, seq_len)
CASES: list[tuple[str, str, dict[str, Any], int]] = [
    ("tiny bf16-mixed adamw", "tiny", {}, 128),
    ("tiny fp32 adamw", "tiny", {"precision": "fp32"}, 128),
    ("tiny bf16 adamw", "tiny", {"precision": "bf16"}, 128),
    ("tiny checkpointing full", "tiny", {"checkpointing": "full"}, 128),
    ("tiny checkpointing selective", "tiny", {"checkpointing": "selective"}, 128),
    ("tiny lora r8 q,v", "tiny", {"lora_rank": 8}, 128),
    ("tiny lora r8 + checkpointing full", "tiny", {"lora_rank": 8, "checkpointing": "full"}, 128),
    ("tiny freeze 1 layer, sgd", "tiny", {"freeze_layers": 1, "optimizer": "sgd"}, 128),
    ("tiny fp32 adafactor", "tiny", {"precision": "fp32", "optimizer": "adafactor"}, 128),
    ("wide bf16-mixed adamw, batch 2", "wide", {"micro_batch": 2}, 96),
    ("wide lora r4 all linear", "wide", {"lora_rank": 4, "lora_targets": ALL_LINEAR}, 96),
    ("wide checkpointing selective", "wide", {"checkpointing": "selective"}, 96),
    ("wider tied, bf16-mixed adamw", "wider", {}, 64),
    ("wider fp32, checkpointing full", "wider", {"precision": "fp32", "checkpointing": "full"}, 64),
    ("wider lora r16 q,v + selective", "wider", {"lora_rank": 16, "checkpointing": "selective"}, 64),
    ("wide fsdp x2 fp32", "wide", {"precision": "fp32", "strategy": "fsdp", "data_parallel": 2}, 64),
    ("wide fsdp x2 bf16-mixed", "wide", {"strategy": "fsdp", "data_parallel": 2}, 64),
    ("wide single fp32 (FSDP's unsharded reference)", "wide", {"precision": "fp32"}, 64),
]


def vllm_python() -> str:
    python = Path(os.environ.get("PLANNER_VLLM_VENV") or REPO / ".venv-vllm") / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no {python}: run `make vllm` or set PLANNER_VLLM_VENV", pytrace=False)
    return str(python)


@pytest.fixture(scope="module")
def measured(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[TrainSettings, int, dict]]:
    folder = tmp_path_factory.mktemp("train-configs")
    models = {"tiny": str(tiny_model.path)}
    for name, config in (("wide", WIDE), ("wider", WIDER)):
        (folder / f"{name}.json").write_text(json.dumps(config))
        models[name] = str(folder / f"{name}.json")
    settings = {name: (TrainSettings(model=models[model], seq_len=seq, **extra), seq) for name, model, extra, seq in CASES}
    cases = [measure_case(s, seq, name=name, device="cpu") for name, (s, seq) in settings.items()]
    results = run_script(vllm_python(), cases, timeout_s=540)
    by_name = {r["name"]: r for r in results["results"]}
    failed = {n: r["error"] for n, r in by_name.items() if r["error"]}
    assert not failed, failed
    return {name: (s, seq, by_name[name]["measured"]) for name, (s, seq) in settings.items()}


def _table(rows: list[tuple[str, list]]) -> str:
    """docs/guides/memory.md's table: model states summed (with the worst of the four errors) and saved activations."""
    lines = [
        "| case | model states, estimate | measured | worst error of the four | saved activations, estimate | measured | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, comparison in rows:
        states, act = comparison[:4], comparison[4]
        worst = max(states, key=lambda r: abs(r.error))
        lines.append(
            f"| {name} | {sum(r.estimate_bytes for r in states):,} | {sum(r.measured_bytes for r in states):,} | {worst.error:+.2%} "
            f"| {act.estimate_bytes:,} | {act.measured_bytes:,} | {act.error:+.3%} |"
        )
    return "\n".join(lines)


@pytest.mark.timeout(600)
def test_estimate_is_within_tolerance_of_pytorch_for_every_case(measured) -> None:
    rows, misses = [], []
    for name, (settings, _, result) in measured.items():
        comparison = compare(train_estimate(settings), result)
        rows.append((name, comparison))
        misses += [f"{name}: {r.quantity} estimate {r.estimate_bytes:,} vs measured {r.measured_bytes:,} ({r.error:+.1%})" for r in comparison if not r.within]
    print("\n" + _table(rows))
    assert not misses, "\n".join(misses)
    assert len(rows) == len(CASES)


@pytest.mark.timeout(600)
def test_fsdp_shards_are_half_of_the_unsharded_step(measured) -> None:
    _, _, sharded = measured["wide fsdp x2 fp32"]
    _, _, whole = measured["wide single fp32 (FSDP's unsharded reference)"]
    assert sharded["world_size"] == 2 and sharded["backend"] == "gloo"
    for field in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
        assert [rank[field] for rank in sharded["ranks"]] == [sharded[field]] * 2
        # Each worker holds half of every sharded state (the optimizer's step counters stay whole).
        assert abs(2 * sharded[field] - whole[field]) <= 0.01 * whole[field], field
    # Sharding does not change what one micro-batch saves for backward.
    assert sharded["saved_activations_bytes"] == whole["saved_activations_bytes"]


@pytest.mark.timeout(600)
def test_what_changes_the_saved_activations(measured) -> None:
    act = {name: result["saved_activations_bytes"] for name, (_, _, result) in measured.items()}
    assert act["tiny checkpointing full"] < act["tiny checkpointing selective"] < act["tiny bf16-mixed adamw"]
    assert act["tiny lora r8 q,v"] < act["tiny bf16-mixed adamw"]
    assert act["tiny fp32 adamw"] > act["tiny bf16 adamw"]
    assert act["tiny bf16 adamw"] == act["tiny bf16-mixed adamw"]
    for _, (_, _, result) in measured.items():
        assert result["cuda_max_allocated_bytes"] is None and "needs a CUDA GPU" in result["cuda_note"]


@pytest.mark.timeout(300)
def test_measure_train_command_records_estimate_and_measurement(tiny_model: TinyModel, tmp_path: Path) -> None:
    out = tmp_path / "measured.json"
    done = subprocess.run(
        [sys.executable, "-m", "planner", "measure-train", "--model", str(tiny_model.path), "--device", "cpu",
         "--micro-batch", "2", "--seq-len", "64", "--lora-rank", "4", "--gpu", "l4", "--output", str(out), "--python", vllm_python()],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "peak CUDA memory needs a CUDA GPU" in done.stdout
    record = json.loads(out.read_text())
    assert record["environment"]["cuda_available"] is False
    assert record["case"]["lora_rank"] == 4 and record["case"]["load_weights"] is True
    assert {row["quantity"] for row in record["comparison"]} >= {"optimizer_bytes", "saved_activations_bytes"}
    assert all(row["within"] for row in record["comparison"]), record["comparison"]
    assert record["estimate"]["parameters"]["source"] == "safetensors"
