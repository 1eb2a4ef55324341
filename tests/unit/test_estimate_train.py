"""`planner estimate --train`: hand-computed budgets, the verdict, and the command's output.

The tiny Llama below is the tiny model's shape (hidden 128, MLP 256, 2 layers, 4 heads of 32,
1 KV head, vocab 512): per layer q 128x128, k and v 32x128, o 128x128, gate and up 256x128,
down 128x256 and two norms of 128 = 139,520 parameters; with embeddings and LM head (512x128
each) and the final norm, 410,240 in all, in 21 tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.commands.measure_train import render as render_measured
from planner.errors import ConfigError, EstimateError
from planner.estimate.train import TrainSettings, train_estimate
from planner.estimate.train_measure import measure_case
from planner.estimate.train_states import optimizer_state_bytes

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
TINY = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
}  # fmt: skip
PARAMS = 410_240
TENSORS = 21


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_model_states_of_mixed_precision_adamw(tiny):
    b = train_estimate(TrainSettings(model=tiny, micro_batch=2, seq_len=64)).per_gpu
    # ZeRO's 16 bytes per parameter: bf16 weights and gradients, fp32 master, two fp32 Adam moments.
    assert (b.weights_bytes, b.master_weights_bytes, b.gradients_bytes) == (2 * PARAMS, 4 * PARAMS, 2 * PARAMS)
    assert b.optimizer_bytes == 8 * PARAMS + 4 * TENSORS  # plus one 4-byte step counter per tensor


def test_saved_activations_by_hand(tiny):
    t, h, i, e = 128, 128, 256, 2  # tokens (2 x 64), hidden, MLP width, bf16
    norm = 4 * t * h + 4 * t + e * t * h  # fp32 upcast, rsqrt, normalised (the weight trains)
    attention = e * t * h + e * t * (2 * 128 + 2 * 32) + 4 * t * 4  # shared q/k/v input; q, k, v, out; log-sum-exp
    mlp = e * t * h + 3 * e * t * i + e * t * i  # shared gate/up input; gate, act, up; down's input
    layer = 2 * norm + attention + mlp
    model = 8 * t + 2 * 64 * 32 * e + norm + e * t * h + 4 * t * 512 + 8 * t + 4  # ids, cos/sin, final norm, LM head, loss
    a = train_estimate(TrainSettings(model=tiny, micro_batch=2, seq_len=64, precision="bf16"))
    assert a.per_gpu.activations_bytes == 2 * layer + model == 1_622_532  # what PyTorch saved (tests/e2e)
    full = train_estimate(TrainSettings(model=tiny, micro_batch=2, seq_len=64, checkpointing="full"))
    # Checkpointing keeps each layer's input only, and no RoPE tables inside the layers.
    assert full.per_gpu.activations_bytes == 2 * e * t * h + model - 2 * 64 * 32 * e == 461_316
    assert full.activations.checkpointed_layers == 2 and full.activations.recomputed_layer_bytes == layer


def test_lora_trains_only_the_adapters(tiny):
    r = train_estimate(TrainSettings(model=tiny, lora_rank=8, seq_len=64))
    # q: A 8x128 + B 128x8; v: A 8x128 + B 32x8; per layer, 2 layers
    assert r.parameters.trainable == r.parameters.lora == 2 * (2048 + 1280) == 6656
    assert r.parameters.total == PARAMS + 6656
    assert r.per_gpu.gradients_bytes == 2 * 6656 and r.per_gpu.weights_bytes == 2 * (PARAMS + 6656)


def test_a_lora_target_that_is_not_there(tiny):
    with pytest.raises(EstimateError, match=r"--lora-targets qkv_proj: no such Linear module .* q_proj"):
        train_estimate(TrainSettings(model=tiny, lora_rank=8, lora_targets=("qkv_proj",)))


def test_optimizer_states():
    assert optimizer_state_bytes("sgd", (10, 20), 200, 4) == 800
    assert optimizer_state_bytes("adafactor", (10, 20), 200, 4) == (10 + 20) * 4 + 4
    assert optimizer_state_bytes("adafactor", (20,), 20, 4) == 20 * 4 + 4
    # bitsandbytes: uint8 states and an fp32 absmax per 256-element block; small tensors stay 32-bit
    assert optimizer_state_bytes("adamw8bit", (1024, 1024), 2**20, 4) == 2 * (2**20 + 4 * 4097) + 4
    assert optimizer_state_bytes("adamw8bit", (64,), 64, 4) == 2 * 64 * 4 + 4


@pytest.mark.parametrize(
    ("strategy", "sharded"),
    [("ddp", set()), ("zero1", {"optimizer", "master"}), ("zero2", {"optimizer", "master", "gradients"}),
     ("fsdp", {"optimizer", "master", "gradients", "weights"})],
)  # fmt: skip
def test_sharding_over_eight_gpus(strategy, sharded):
    model = str(CONFIGS / "llama-3-8b.json")
    one = train_estimate(TrainSettings(model=model, seq_len=1024)).per_gpu
    many = train_estimate(TrainSettings(model=model, seq_len=1024, strategy=strategy, data_parallel=8)).per_gpu
    for name in ("optimizer", "master", "gradients", "weights"):
        field = "master_weights_bytes" if name == "master" else f"{name}_bytes"
        expected = getattr(one, field) / 8 if name in sharded else getattr(one, field)
        assert getattr(many, field) == pytest.approx(expected, rel=1e-4), field
    assert many.activations_bytes == one.activations_bytes


def test_largest_micro_batch_is_the_edge(tiny):
    settings = TrainSettings(model=tiny, seq_len=512, gpu_memory_bytes=1 << 30)
    v = train_estimate(settings).verdict
    assert v.status == "fits" and v.largest_micro_batch > 1
    edge = train_estimate(settings.model_copy(update={"micro_batch": v.largest_micro_batch})).per_gpu
    over = train_estimate(settings.model_copy(update={"micro_batch": v.largest_micro_batch + 1})).per_gpu
    assert edge.total_bytes <= 1 << 30 < over.total_bytes
    assert train_estimate(settings.model_copy(update={"seq_len": v.largest_seq_len})).per_gpu.total_bytes <= 1 << 30


def test_the_verdict_names_what_to_change():
    r = train_estimate(TrainSettings(model=str(CONFIGS / "llama-3-8b.json"), gpu="h100", seq_len=4096))
    v = r.verdict
    assert v.status == "does_not_fit" and v.missing_bytes == r.per_gpu.total_bytes - r.per_gpu.gpu_bytes
    fitting = {s.change for s in v.suggestions if s.fits}
    assert "FSDP over 4 GPUs (--strategy fsdp --gpus 4)" in fitting
    assert any(change.startswith("LoRA rank 16") for change in fitting)
    assert "these fit: " in v.message and "FSDP over 4 GPUs" in v.message


def test_dense_decoders_only():
    with pytest.raises(EstimateError, match="mixture of experts"):
        train_estimate(TrainSettings(model=str(CONFIGS / "mixtral-8x7b-v0.1.json")))


def test_text_report(tiny, capsys):
    rc = main(["estimate", "--train", "--model", tiny, "--gpu-memory-gib", "1", "--micro-batch", "2", "--seq-len", "64", "--lora-rank", "8"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0] == f"{tiny} (llama), training on 1.00 GiB GPU: 1 GPU, 1 GPU(s) in all"
    assert out[1] == "bf16-mixed AdamW, LoRA rank 8 on q_proj,v_proj (6,656 trainable of 416,896)"
    assert out[2] == "micro-batch 2 x seq-len 64 = 128 tokens, grad-accum 1 (effective batch 2 sequences), checkpointing none"
    assert out[4] == "  fp32 master weights              26.00 KiB"
    assert out[13].startswith("largest micro-batch at seq-len 64: ")
    assert out[14].startswith("verdict: fits, ")


def test_json_and_serving_flags(tiny, capsys):
    rc = main(["estimate", "--train", "--model", tiny, "--strategy", "ddp", "--gpus", "4", "--grad-accum", "8", "--json"])
    point = json.loads(capsys.readouterr().out)["points"][0]
    assert rc == 0
    assert point["effective_batch"] == 32 and point["gpus"] == 4
    assert point["verdict"]["status"] == "unknown"
    assert main(["estimate", "--train", "--model", tiny, "--max-model-len", "1024"]) == 2
    assert "--max-model-len: serving flag(s) that --train does not use" in capsys.readouterr().err
    assert main(["estimate", "--train", "--model", tiny, "--gpus", "2"]) == 2
    assert "strategy single runs on one data-parallel worker" in capsys.readouterr().err


def test_measure_case_refuses_what_it_cannot_run(tiny):
    with pytest.raises(ConfigError, match="tensor parallelism is estimated, not measured"):
        measure_case(TrainSettings(model=tiny, tensor_parallel_size=2), 64, name="x")
    with pytest.raises(ConfigError, match="--strategy zero2"):
        measure_case(TrainSettings(model=tiny, strategy="zero2", data_parallel=2), 64, name="x")
    case = measure_case(TrainSettings(model=tiny, strategy="fsdp", data_parallel=2, lora_rank=4), 64, name="x")
    assert (case["strategy"], case["workers"], case["config"]["hidden_size"], case["lora_rank"]) == ("fsdp", 2, 128, 4)


def test_measure_train_without_a_torch_python(tiny, capsys, monkeypatch):
    monkeypatch.delenv("PLANNER_TRAIN_PYTHON", raising=False)
    monkeypatch.setenv("PLANNER_VLLM_VENV", "/nonexistent-venv")
    assert main(["measure-train", "--model", tiny]) == 2
    assert "no python with torch found: /nonexistent-venv/bin/python does not exist" in capsys.readouterr().err


def _record(measured_extra: dict) -> dict:
    estimate = {"model": "m", "per_gpu": {"total_bytes": 3 << 30}}
    comparison = [{"quantity": "weights_bytes", "estimate_bytes": 1024, "measured_bytes": 1024, "relative_error": 0.0}]
    return {"estimate": estimate, "measured": {"process_max_rss_bytes": 2 << 20, **measured_extra}, "comparison": comparison,
            "environment": {"torch": "2.x", "transformers": "5.x", "cuda_available": False}}  # fmt: skip


def test_measured_record_says_what_needs_a_gpu():
    lines = render_measured(_record({"cuda_max_allocated_bytes": None, "cuda_note": "peak CUDA memory needs a CUDA GPU: not measured"}))
    assert lines[2] == "  weights_bytes                   1.00 KiB      1.00 KiB    +0.0%"
    assert lines[3] == "  process peak RSS (CPU): 2.00 MiB; peak CUDA memory needs a CUDA GPU: not measured"
    gpu = render_measured(_record({"cuda_max_allocated_bytes": 2 << 30, "cuda_max_reserved_bytes": 5 << 29, "cuda_device": "H200"}))
    assert gpu[3] == "  estimate total per GPU          3.00 GiB"
    assert gpu[4].endswith("2.00 GiB  on H200") and gpu[5].endswith("2.50 GiB")


def test_the_peak_is_the_larger_phase():
    model = str(CONFIGS / "llama-3-8b.json")
    b = train_estimate(TrainSettings(model=model, seq_len=4096)).per_gpu
    # AdamW's step: the fp32 gradients of the master step and one more copy of exp_avg_sq
    assert b.step_temporary_bytes == b.master_weights_bytes + b.optimizer_bytes // 2
    assert b.temporary_bytes == max(b.backward_temporary_bytes, b.step_temporary_bytes - b.activations_bytes)
    assert b.total_bytes == b.model_states_bytes + b.activations_bytes + b.temporary_bytes + b.framework_bytes
    # With SGD in pure bf16 the step adds nothing; backward is the peak.
    sgd = train_estimate(TrainSettings(model=model, seq_len=4096, optimizer="sgd", precision="bf16")).per_gpu
    assert sgd.step_temporary_bytes == 0 and sgd.temporary_bytes == sgd.backward_temporary_bytes


def test_tensor_parallel_splits_matrices_and_keeps_norms(tiny):
    one = train_estimate(TrainSettings(model=tiny, seq_len=64, precision="fp32")).per_gpu
    two = train_estimate(TrainSettings(model=tiny, seq_len=64, precision="fp32", tensor_parallel_size=2)).per_gpu
    norms = 5 * 128  # two per layer and the final one, replicated on both ranks
    # k and v have one KV head, fewer than the ranks: each rank keeps it whole (as vLLM does)
    kv = 2 * 2 * 32 * 128
    assert two.weights_bytes == 4 * ((PARAMS - norms - kv) // 2 + norms + kv)
    with pytest.raises(EstimateError, match="--freeze-layers 3 is more than the model's 2 layers"):
        train_estimate(TrainSettings(model=tiny, freeze_layers=3))
    with pytest.raises(EstimateError, match="--seq-len 8192 is longer than the model's max_position_embeddings 4096"):
        train_estimate(TrainSettings(model=tiny, seq_len=8192))
    assert one.weights_bytes == 4 * PARAMS


def test_fp32_names_the_attention_probabilities_cuda_keeps(tiny):
    # 2 layers, selective checkpointing of every 2nd (layer 0): layer 1 keeps 2 x 4 heads x 64^2 x 4 bytes.
    fp32 = train_estimate(TrainSettings(model=tiny, micro_batch=2, seq_len=64, precision="fp32", checkpointing="selective"))
    [note] = [n for n in fp32.estimates if n.startswith("fp32 on a CUDA GPU")]
    assert f"about {2 * 4 * 64 * 64 * 4 // 1024}.00 KiB (1 layers not checkpointed" in note
    full = train_estimate(TrainSettings(model=tiny, micro_batch=2, seq_len=64, precision="fp32", checkpointing="full"))
    bf16 = train_estimate(TrainSettings(model=tiny, micro_batch=2, seq_len=64, precision="bf16-mixed"))
    assert not [n for n in full.estimates + bf16.estimates if n.startswith("fp32 on a CUDA GPU")]
