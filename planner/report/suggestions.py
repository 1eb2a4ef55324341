"""What to try next for each way a point can fail, keyed by the sweep's failure kinds."""

from __future__ import annotations

from planner.capacity import Failure

SUGGESTIONS: dict[str, str] = {
    "kv_too_small": (
        "the KV cache cannot hold one request of max-model-len tokens; raise --gpu-memory-utilization, "
        "use more tensor-parallel GPUs, or lower --max-model-len"
    ),
    "no_kv_memory": (
        "the weights left no memory for the KV cache; raise --gpu-memory-utilization or shard the model "
        "over more GPUs (--tensor-parallel-size)"
    ),
    "gpu_oom": (
        "the GPU ran out of memory while loading or warming up; lower --gpu-memory-utilization or "
        "--max-num-seqs, or use more tensor-parallel GPUs"
    ),
    "world_size_too_large": (
        "tensor-parallel x pipeline-parallel size is larger than the GPUs on this node; keep it at or "
        "below the GPU count"
    ),
    "heads_not_divisible": "choose a --tensor-parallel-size that divides the model's attention heads",
    "max_model_len_too_long": (
        "--max-model-len is above the model's own limit (its config's max_position_embeddings); lower "
        "it, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the model really supports it"
    ),
    "bad_flag": "a flag is not accepted by this vLLM version; check the log tail and `vllm serve --help`",
    "timeout": "the server was not ready in time; raise the start-up timeout or check the log for a stall",
    "crashed": "the server exited during start-up; the log tail holds the cause",
    "port_taken": (
        "another process took the server's port before it could bind it, on every try; leave [server] port"
        " unset (a free one is chosen per start) or free the port, then --resume"
    ),
    "master_port_taken": (
        "another process held the torch.distributed port of vLLM's workers (on rank 0's node, across"
        " nodes) on every try; find what binds ports there so fast, then --resume"
    ),
    "server_died": (
        "the server died or stopped answering during the replay; check the log, and lower the "
        "concurrency ceiling or --gpu-memory-utilization"
    ),
    "server_oom_killed": (
        "the kernel's OOM killer ended the server (host memory, not GPU memory); give the server more memory"
        " (its container's limit, fewer points at once) or lower --max-num-seqs / --swap-space / --cpu-offload-gb"
    ),
    "server_hung": (
        "the server stopped answering while its process ran (stopped, or a stuck API server); the message says"
        " what was seen; check the log and the machine (a debugger, a SIGSTOP, a stuck driver), then --resume"
    ),
    "stream_stalled": (
        "the server answered /health but its streams stopped sending (a stuck engine); check the log's last"
        " lines for the engine's state, then --resume"
    ),
    "metrics_lost": (
        "the server's /metrics stopped giving vLLM metrics mid-point and an SLO needs them; check what answers"
        " /metrics (a proxy, --disable-log-stats), or drop the server-side SLO, then --resume"
    ),
    "replay_error": "the replay could not use the server (see the message); fix that and rerun the point",
    "interrupted": "the sweep stopped during this point; rerun the sweep to measure it",
    "no_capacity": "the server reported no KV-cache capacity; set [replay] max_concurrency to bound the search",
    "planner_error": "an error in the planner itself (its traceback is in the log tail); rerun with --resume, and report it",
    "node_lost": (
        "a node the point ran on went away (Ray's error is in the message); rerun with --resume, or raise "
        "[executor] max_retries"
    ),
    "not_enough_gpus": (
        "no node (or, with nnodes, not that many nodes) has the GPUs and resources the point asks for: add "
        "nodes, use fewer GPUs per node (raise nnodes), or loosen [executor.node_selector]; a local sweep "
        'runs a point across nodes only on a Ray cluster ([executor] kind = "ray")'
    ),
    "predicted_infeasible": (
        "skipped without launching: the estimate says the KV cache cannot hold one max-model-len "
        "request; the same remedies as kv_too_small apply"
    ),
}

NO_PASSING_STEP = "no concurrency met every SLO; the binding constraint is the SLO to relax or the resource to add"
# Statuses of a sweep still running, or of the file of one that was killed.
NOT_MEASURED = "not measured yet; rerun the sweep (or wait for it) to fill this point in"


def suggest(failure: Failure | None, status: str = "infeasible") -> str:
    if failure is None:
        return NOT_MEASURED if status in ("pending", "running") else NO_PASSING_STEP
    if failure.kind == "kv_too_small" and failure.estimated_max_model_len:
        return (
            f"the largest max-model-len that fits is {failure.estimated_max_model_len} (vLLM's estimate): "
            f"run with --max-model-len {failure.estimated_max_model_len}, or raise "
            "--gpu-memory-utilization / --tensor-parallel-size to keep the longer context"
        )
    return SUGGESTIONS.get(failure.kind, "see the server log")
