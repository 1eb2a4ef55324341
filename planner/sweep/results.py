"""The sweep's results schema (sweep.json). Rewritten atomically after every point."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from replay.results import StepResult

SCHEMA_VERSION = 1

# pending and running appear only while a sweep runs (or in the file of one that was killed).
PointStatus = Literal["ok", "infeasible", "failed", "predicted_infeasible", "pending", "running"]

# Start-up failure kinds, classified from the server log.
FailureKind = Literal[
    "kv_too_small",
    "no_kv_memory",
    "gpu_oom",
    "world_size_too_large",
    "heads_not_divisible",
    "max_model_len_too_long",
    "bad_flag",
    "timeout",
    "crashed",
    # During the replay (status "failed"): the server died or stopped answering.
    "server_died",
    "replay_error",
    # Ready, but it reported no KV-cache capacity and the search had no other bound.
    "no_capacity",
    # An unforeseen error in the planner itself: the point failed, the sweep went on.
    "planner_error",
    "predicted_infeasible",
    "interrupted",
]


# Start-up failures that say the configuration cannot run (status "infeasible"), as opposed to a
# broken launch (status "failed").
INFEASIBLE_KINDS = frozenset(
    {"kv_too_small", "no_kv_memory", "gpu_oom", "world_size_too_large", "heads_not_divisible", "max_model_len_too_long"}
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Capacity(_Model):
    kv_cache_tokens: int | None = None
    max_concurrency_reported: float | None = None
    # The max_model_len that max_concurrency_reported is quoted for.
    max_model_len: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    # Where kv_cache_tokens came from: "log", "metrics", or "log+metrics" when both agreed.
    source: str | None = None
    # Both figures when the log and vllm:cache_config_info disagree (they should not).
    log_kv_cache_tokens: int | None = None
    metrics_kv_cache_tokens: int | None = None
    available_kv_cache_gib: float | None = None
    model_weights_gib: float | None = None
    model_load_s: float | None = None
    cuda_graph_gib: float | None = None


class Failure(_Model):
    kind: FailureKind
    message: str
    estimated_max_model_len: int | None = None
    exit_code: int | None = None
    log_tail: list[str] = Field(default_factory=list)


class PointResult(_Model):
    id: str
    # The point's axis values: flag names in underscore form (max_model_len, gpu_memory_utilization,
    # tensor_parallel_size, and every [grid.extra] flag) plus "env" for [grid.env] axes.
    config: dict[str, Any]
    command: list[str]
    status: PointStatus
    fingerprint: str
    started_at: str | None = None
    duration_s: float | None = None
    vllm_version: str | None = None
    capacity: Capacity = Field(default_factory=Capacity)
    failure: Failure | None = None
    # The search's ceiling: corpus-aware KV bound, never below vLLM's reported max concurrency.
    concurrency_upper_bound: int | None = None
    mean_blocks_per_request: float | None = None
    steps: list[StepResult] = Field(default_factory=list)
    max_passing_concurrency: int | None = None
    min_failing_concurrency: int | None = None
    safe_concurrency: int | None = None
    gpus: int = 1
    gpu_ids: list[str] = Field(default_factory=list)
    safe_concurrency_per_gpu: float | None = None
    output_tokens_per_s_per_gpu: float | None = None
    binding_constraint: str | None = None
    # max_passing_concurrency passed again on fresh prompts; the knee lies in knee_interval
    # [highest conclusive pass, lowest conclusive fail]. Absent in older files.
    confirmed: bool | None = None
    knee_interval: list[int | None] | None = None
    # Peak used memory per GPU over the point's steps, and what was left of each GPU's total.
    gpu_memory_peak_mib: dict[str, float] | None = None
    gpu_memory_headroom_mib: dict[str, float] | None = None
    # From `planner estimate` before launching (see planner.estimate); None when not predicted.
    prediction: dict[str, Any] | None = None
    kv_cache_tokens_predicted: int | None = None
    kv_cache_tokens_relative_error: float | None = None
    log_path: str | None = None


class Best(_Model):
    point_id: str
    safe_concurrency_per_gpu: float
    output_tokens_per_s_per_gpu: float | None = None
    reason: str
    # Why every other point lost, keyed by point id.
    others: dict[str, str] = Field(default_factory=dict)


class SweepResults(_Model):
    schema_version: int = SCHEMA_VERSION
    started_at: str
    settings: dict[str, Any]
    points: list[PointResult] = Field(default_factory=list)
    best: Best | None = None
    interrupted: bool = False
