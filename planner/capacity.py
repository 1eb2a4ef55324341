"""What a vLLM server tells the planner about itself: the KV capacity it reports once ready
(Capacity), or why it did not start or stopped serving (Failure). planner.vllm_log reads both
from the server's log; the launcher, the sweep and the report pass them on unchanged."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from replay.model import ResultModel

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
    # A vLLM worker could not listen on its torch.distributed port, which another process held: a
    # point across nodes' --master-port (its ranks start again on a port chosen afresh), or on one
    # node the port vLLM picked itself (its server starts again).
    "master_port_taken",
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


class Capacity(ResultModel):
    # Tokens the KV cache holds, as the server reported.
    kv_cache_tokens: int | None = None
    # vLLM's own maximum concurrency at max_model_len (its start-up line).
    max_concurrency_reported: float | None = None
    # The max_model_len that max_concurrency_reported is quoted for.
    max_model_len: int | None = None
    # Tokens per KV block.
    block_size: int | None = None
    # KV blocks in the pool.
    num_gpu_blocks: int | None = None
    # Where kv_cache_tokens came from: "log", "metrics", or "log+metrics" when both agreed.
    source: str | None = None
    # Both figures when the log and vllm:cache_config_info disagree (they should not).
    log_kv_cache_tokens: int | None = None
    # The KV tokens vllm:cache_config_info implies.
    metrics_kv_cache_tokens: int | None = None
    # Memory vLLM gave the KV cache (its log).
    available_kv_cache_gib: float | None = None
    # The weights' memory (its log).
    model_weights_gib: float | None = None
    # How long loading the weights took (its log).
    model_load_s: float | None = None
    # Memory of the CUDA graphs (its log).
    cuda_graph_gib: float | None = None


class Failure(ResultModel):
    # The classified failure: kv_too_small, no_kv_memory, gpu_oom, world_size_too_large,
    # heads_not_divisible, max_model_len_too_long, not_enough_gpus (infeasible), or bad_flag,
    # timeout, crashed, server_died, node_lost, ... (failed).
    kind: FailureKind
    # What the server or the planner said.
    message: str
    # For kv_too_small: vLLM's largest max-model-len that fits.
    estimated_max_model_len: int | None = None
    # The server's exit code.
    exit_code: int | None = None
    # The last lines of the server's log.
    log_tail: list[str] = Field(default_factory=list)
