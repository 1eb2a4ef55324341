"""The sweep's entry point: a prediction for one grid point, from the flags it will launch with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.estimate.memory import WorkingMemoryModel
from planner.estimate.plan import Device, Estimate, EstimateSettings, estimate
from planner.validation import build

# The point flags (underscore form, as in PointResult.config) that change the prediction.
POINT_FLAGS = (
    "max_model_len",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "kv_cache_dtype",
    "block_size",
    "kv_cache_memory_bytes",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enforce_eager",
)


def estimate_point(
    model: str,
    flags: Mapping[str, Any],
    *,
    device: Device = "gpu",
    gpu_memory_bytes: int | None = None,
    gpu: str | None = None,
    working: WorkingMemoryModel | None = None,
    request_tokens: list[int] | None = None,
) -> Estimate:
    """Predict one point. `flags` holds the point's vLLM flags in underscore form; values may be
    strings as vLLM takes them ("2M", "256K", "0.9", "fp8"). Other keys (env, extra flags that do
    not change memory) are ignored. device="cpu" is vLLM's CPU build: block size 128 unless
    given, the pool exactly --kv-cache-memory-bytes. Returns `estimate()`'s Estimate; its
    `kv_cache_tokens` is what vLLM's "KV cache size" line should report and its `verdict` says
    fits / does_not_fit / unknown with the margin and whether it is clear.

    Raises EstimateError when the model cannot be sized and ConfigError for a bad flag value.
    """
    data: dict[str, Any] = {k: flags[k] for k in POINT_FLAGS if flags.get(k) is not None}
    if "enforce_eager" in data and not isinstance(data["enforce_eager"], bool):
        data["enforce_eager"] = str(data["enforce_eager"]).lower() in ("1", "true", "yes", "")
    data.update(model=str(model), device=device, gpu_memory_bytes=gpu_memory_bytes, gpu=gpu)
    if working is not None:
        data["working"] = working
    settings = build(EstimateSettings, data, source="estimate for the sweep point")
    return estimate(settings, request_tokens=request_tokens)


def kv_tokens_relative_error(predicted: int | None, reported: int | None) -> float | None:
    """(predicted - reported) / reported; None when either is missing or nothing was reported."""
    if predicted is None or not reported:
        return None
    return round((predicted - reported) / reported, 6)
