"""The verdict: does one max_model_len request fit the predicted pool, and by how much.

The reasons are the start-up failure kinds planner sweep classifies from real logs, so a
prediction and an observed failure can be compared one to one:

    kv_too_small            the pool is smaller than one max_model_len request (+ null block)
    no_kv_memory            nothing is left for the KV cache after weights and working memory
    gpu_oom                 weights + working memory + an explicit --kv-cache-memory-bytes exceed the GPU
    heads_not_divisible     attention heads do not split evenly over tensor_parallel_size
    max_model_len_too_long  max_model_len exceeds the model's max_position_embeddings

A margin is "clear" when it is larger than the model's uncertainty: zero for a pool sized
explicitly by --kv-cache-memory-bytes (vLLM allocates exactly that), otherwise half the
predicted working memory plus 1 GiB (WorkingMemoryModel.uncertainty_*; plus 5% of the weights
when they were only estimated from config.json). Sweeps skip only points that do not fit by a clear margin.
"""

from __future__ import annotations

from typing import Any

from planner.estimate.kv_pool import PoolLayout, largest_fitting_len, needed_bytes


def verdict(
    *,
    layout: PoolLayout,
    available_kv_bytes: int,
    max_model_len: int,
    uncertainty_bytes: int,
    search_upper: int,
    headroom_bytes: int | None = None,
    headroom_uncertainty_bytes: int = 0,
) -> dict[str, Any]:
    needed = needed_bytes(layout, max_model_len)
    margin = available_kv_bytes - needed
    reason = None
    if available_kv_bytes <= 0:
        reason = "no_kv_memory"
    elif margin < 0:
        reason = "kv_too_small"
    elif headroom_bytes is not None and headroom_bytes < 0:
        reason = "gpu_oom"
        margin, uncertainty_bytes = headroom_bytes, headroom_uncertainty_bytes
    fits = reason is None
    largest = largest_fitting_len(layout, available_kv_bytes, max_model_len if not fits else max(search_upper, max_model_len))
    return {
        "status": "fits" if fits else "does_not_fit",
        "reason": reason,
        "needed_kv_bytes": needed,
        "available_kv_bytes": available_kv_bytes,
        "margin_bytes": margin,
        "missing_bytes": max(0, -margin),
        "margin_fraction": round(margin / needed, 4) if needed else None,
        "uncertainty_bytes": uncertainty_bytes,
        "clear_margin": abs(margin) > uncertainty_bytes,
        "largest_fitting_max_model_len": largest or None,
    }


def refused(reason: str, message: str) -> dict[str, Any]:
    """A verdict for a configuration vLLM refuses before sizing anything."""
    return {
        "status": "does_not_fit",
        "reason": reason,
        "message": message,
        "needed_kv_bytes": None,
        "available_kv_bytes": None,
        "margin_bytes": None,
        "missing_bytes": None,
        "margin_fraction": None,
        "uncertainty_bytes": 0,
        "clear_margin": True,
        "largest_fitting_max_model_len": None,
    }


def unknown(message: str) -> dict[str, Any]:
    return {
        "status": "unknown",
        "reason": None,
        "message": message,
        "needed_kv_bytes": None,
        "available_kv_bytes": None,
        "margin_bytes": None,
        "missing_bytes": None,
        "margin_fraction": None,
        "uncertainty_bytes": None,
        "clear_margin": False,
        "largest_fitting_max_model_len": None,
    }
