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

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_serializer

from planner.estimate.kv_pool import PoolLayout, largest_fitting_len, needed_bytes

FitReason = Literal["kv_too_small", "no_kv_memory", "gpu_oom", "heads_not_divisible", "max_model_len_too_long"]


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    status: Literal["fits", "does_not_fit", "unknown"]
    reason: FitReason | None = None
    # Only when vLLM refuses the configuration before sizing anything, or the pool is unknown.
    message: str | None = None
    needed_kv_bytes: int | None = None
    available_kv_bytes: int | None = None
    margin_bytes: int | None = None
    missing_bytes: int | None = None
    margin_fraction: float | None = None
    uncertainty_bytes: int | None = None
    clear_margin: bool
    largest_fitting_max_model_len: int | None = None

    @model_serializer(mode="wrap")
    def _without_empty_message(self, handler: Any) -> dict[str, Any]:
        # A sized verdict has never carried a message key; sweep.json and --json keep that shape.
        data = handler(self)
        if self.message is None:
            del data["message"]
        return data


def verdict(
    *,
    layout: PoolLayout,
    available_kv_bytes: int,
    max_model_len: int,
    uncertainty_bytes: int,
    search_upper: int,
    headroom_bytes: int | None = None,
    headroom_uncertainty_bytes: int = 0,
) -> Verdict:
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
    return Verdict(
        status="fits" if fits else "does_not_fit",
        reason=reason,
        needed_kv_bytes=needed,
        available_kv_bytes=available_kv_bytes,
        margin_bytes=margin,
        missing_bytes=max(0, -margin),
        margin_fraction=round(margin / needed, 4) if needed else None,
        uncertainty_bytes=uncertainty_bytes,
        clear_margin=abs(margin) > uncertainty_bytes,
        largest_fitting_max_model_len=largest or None,
    )


def refused(reason: FitReason, message: str) -> Verdict:
    """A verdict for a configuration vLLM refuses before sizing anything."""
    return Verdict(status="does_not_fit", reason=reason, message=message, uncertainty_bytes=0, clear_margin=True)


def unknown(message: str) -> Verdict:
    return Verdict(status="unknown", message=message, clear_margin=False)
