"""Sweeps to export from: the saved fixture, and one whose recommended point has everything an
export can use (a Hub model at a revision, a secret key, env, a measured start-up)."""

from __future__ import annotations

from pathlib import Path

from planner.sweep.results import SweepResults, write_results
from tests.fakes.results import sweep_fixture


def full_sweep(folder: Path, *, safe: int = 43, max_passing: int = 48) -> Path:
    """sweep.json in `folder` whose best point serves org/model@abc123 with an API key and env."""
    results = sweep_fixture()
    best = results.best.point_id
    data = results.model_dump(mode="json")
    data["settings"]["server"]["api_key"] = "***"
    data["settings"]["server"]["env"] = {"VLLM_LOGGING_LEVEL": "INFO", "HF_TOKEN": "***"}
    data["settings"]["slo"]["server_tpot_p90_ms"] = 45.0
    data["settings"]["slo"]["ttft_max_ms"] = 5000.0
    for p in data["points"]:
        if p["id"] == best:
            p["command"] = [
                "vllm", "serve", "--model", "org/model", "--revision", "abc123", "--host", "127.0.0.1", "--port", "41234",
                "--max-model-len", "8192", "--gpu-memory-utilization", "0.85", "--tensor-parallel-size", "2",
                "--api-key", "***",
            ]
            p["config"]["env"] = {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
            p["startup_s"] = 95.4
            p["safe_concurrency"] = safe
            p["max_passing_concurrency"] = max_passing
            p["gpu_model"] = "NVIDIA H100 80GB HBM3"
    folder.mkdir(parents=True, exist_ok=True)
    write_results(folder, SweepResults.model_validate(data))
    return folder / "sweep.json"
