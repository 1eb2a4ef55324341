"""The working-memory model against published vLLM start-up logs (the calibration table in docs/guides/memory.md).

Those logs come from vLLM releases of late 2024, which did not subtract CUDA graph memory and
ran the profiling pass at max_model_len tokens with 256 sequences; the cases set the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.estimate import estimate_point
from planner.estimate.memory import WorkingMemoryModel
from planner.estimate.units import GIB

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"

# (where, GPU total GiB, tp, max_model_len, logged "available KV cache" GiB)
CALIBRATION = [
    ("vllm-project/vllm#10511 Llama-3-8B H100 TP1", 79.22, 1, 8192, 53.29),
    ("vllm-project/vllm#10511 Llama-3-8B H100 TP2", 79.22, 2, 8192, 58.97),
    ("vllm-project/vllm#10517 Llama-3.1-8B RTX 3090 20k", 23.58, 1, 20000, 3.81),
    ("vllm-project/vllm#10517 Llama-3.1-8B RTX 3090 29k", 23.58, 1, 29000, 2.89),
]


@pytest.fixture(scope="module")
def llama31(tmp_path_factory) -> Path:
    # Llama 3.1 8B is Llama 3 8B with a 128k context.
    cfg = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    cfg["max_position_embeddings"] = 131072
    path = tmp_path_factory.mktemp("llama31") / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(("where", "total_gib", "tp", "max_len", "logged_gib"), CALIBRATION, ids=[c[0] for c in CALIBRATION])
def test_available_kv_within_the_verdicts_uncertainty(llama31, where, total_gib, tp, max_len, logged_gib):
    p = estimate_point(
        str(llama31),
        {"max_model_len": max_len, "gpu_memory_utilization": 0.9, "tensor_parallel_size": tp, "max_num_batched_tokens": max_len, "max_num_seqs": 256},
        gpu_memory_bytes=int(total_gib * GIB),
        working=WorkingMemoryModel(cuda_graphs_gib=0),
    )
    predicted = p.budget.available_kv_bytes
    error = abs(predicted - logged_gib * GIB)
    assert error < p.verdict.uncertainty_bytes, f"{where}: predicted {predicted / GIB:.2f} GiB"
    assert error < 2 * GIB


def test_weights_from_config_match_the_logged_model_loading(llama31):
    # "model weights take 14.96GiB" (vllm#10511) for Meta-Llama-3-8B in bf16.
    p = estimate_point(str(llama31), {"max_model_len": 8192}, gpu="h100-80gb")
    assert p.weights.per_gpu_bytes / GIB == pytest.approx(14.96, abs=0.01)


def test_enforce_eager_drops_cuda_graphs_and_tp_adds_nccl(llama31):
    eager = estimate_point(str(llama31), {"max_model_len": 8192, "enforce_eager": True}, gpu="h100-80gb")
    graphs = estimate_point(str(llama31), {"max_model_len": 8192}, gpu="h100-80gb")
    assert eager.budget.cuda_graphs_bytes == 0
    assert graphs.budget.cuda_graphs_bytes == int(0.5 * GIB)
    assert eager.budget.available_kv_bytes - graphs.budget.available_kv_bytes == int(0.5 * GIB)
    tp2 = estimate_point(str(llama31), {"max_model_len": 8192, "tensor_parallel_size": 2}, gpu="h100-80gb")
    assert tp2.budget.framework_and_reserve_bytes == int((0.5 + 1.75) * GIB)


def test_default_batch_follows_vllm_by_gpu_size(llama31):
    assert estimate_point(str(llama31), {"max_model_len": 8192}, gpu="l4").settings.max_num_batched_tokens == 2048
    assert estimate_point(str(llama31), {"max_model_len": 8192}, gpu="a100-80gb").settings.max_num_seqs == 256
    assert estimate_point(str(llama31), {"max_model_len": 8192}, gpu="b200").settings.max_num_batched_tokens == 16384
