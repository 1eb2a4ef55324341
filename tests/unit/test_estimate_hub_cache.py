"""Estimates of Hub models read from the offline Hub cache (tests/unit/conftest.py)."""

from __future__ import annotations

import json

from planner.cli import main
from tests.fakes.fake_hub import commit_of


def test_the_training_estimate_reads_hub_models_too(offline_hub, capsys):
    assert main(["estimate", "--train", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--json"]) == 0
    point = json.loads(capsys.readouterr().out)["points"][0]
    assert point["revision"] == commit_of("main")
    # Llama 3.1 8B's 8.03 B parameters, counted from the cached safetensors headers.
    assert (point["parameters"]["source"], point["parameters"]["total"]) == ("safetensors", 8_030_261_248)


def test_a_sweep_points_prediction_keeps_the_commit(offline_hub):
    from planner.estimate import estimate_point

    est = estimate_point("meta-llama/Llama-3.1-70B-Instruct", {"tensor_parallel_size": 4, "max_model_len": "32K"}, gpu="H100")
    assert (est.model.revision, est.weights.read_from, est.weights.files) == (commit_of("main"), "Hub cache", 30)
    # Mixtral's every expert is counted: 46.7 B parameters in bf16.
    est = estimate_point("mistralai/Mixtral-8x7B-Instruct-v0.1", {"tensor_parallel_size": 2}, gpu="H100")
    assert (est.weights.source, est.weights.total_bytes) == ("safetensors", 2 * 46_702_792_704)
    est = estimate_point("org/config-only", {}, gpu="H100")
    assert (est.weights.source, est.weights.read_from) == ("config", "config.json")
    assert "weights: parameter count from config.json x dtype bytes (HF_HUB_OFFLINE=1 and the safetensors index is not in the Hub cache)" in est.estimates
