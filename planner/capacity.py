"""What a vLLM server tells the planner about itself: the KV capacity it reports once ready
(Capacity), or why it did not start or stopped serving (Failure). planner.vllm_log reads both
from the server's log; the launcher, the sweep and the report pass them on unchanged."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
    # Another process held the server's port when it bound it (a sweep starts it again elsewhere).
    "port_taken",
    # During the replay (status "failed"): the server died or stopped answering.
    "server_died",
    # The server's process was killed by the kernel's OOM killer (SIGKILL, and the cgroup counted it).
    "server_oom_killed",
    # Alive but doing nothing (planner.sweep.liveness): stopped (SIGSTOP), or /health unanswered.
    "server_hung",
    # /health answers but no stream moves: requests end on the read timeout with nothing sent.
    "stream_stalled",
    # /metrics went away mid-point and an SLO needs the server's metrics (max_preemptions, ttft_server_*).
    "metrics_lost",
    "replay_error",
    # Ready, but it reported no KV-cache capacity and the search had no other bound.
    "no_capacity",
    # An unforeseen error in the planner itself: the point failed, the sweep went on.
    "planner_error",
    "predicted_infeasible",
    "interrupted",
    # Ray executor: the point's node (or its worker) went away max_retries + 1 times.
    "node_lost",
    # No node of the Ray cluster has the GPUs (and node_selector resources) the point needs, or, for a
    # point across nodes (nnodes > 1), not that many nodes have them; or a local sweep and nnodes > 1.
    "not_enough_gpus",
]


class _Model(BaseModel):
    # Results written by a newer planner still load: unknown keys are ignored, not refused.
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
