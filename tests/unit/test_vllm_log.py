"""planner.vllm_log against recorded start-up logs (tests/fixtures/vllm_logs) and /metrics text.

Files named real-*.log / real-*.txt were recorded from vLLM 0.32's CPU build; the others copy
vLLM's formats line for line (prefixes, tracebacks, the wrapper lines after the root cause).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.capacity import Capacity
from planner.vllm_log import (
    cache_config_labels,
    classify_failure,
    clean_line,
    kv_cache_device,
    merge_cache_config,
    parse_capacity,
    parse_version,
    ready_address,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = FIXTURES / "vllm_logs"
METRICS = FIXTURES / "vllm_metrics"


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


# name -> (kv_cache_tokens, max_model_len, max_concurrency_reported, available_kv_cache_gib,
#          model_weights_gib, model_load_s, cuda_graph_gib)
CAPACITY_CASES = {
    "real-0.32-cpu-ok.log": (8192, 2048, 4.0, 0.0, None, None, None),
    "real-0.32-cpu-preempted.log": (4096, 2048, 2.0, 0.0, None, None, None),
    "cpu-0.32-ready.log": (8192, 1024, 8.0, 0.0, 0.0012, 0.052114, None),
    "cpu-0.32-auto-kv.log": (4_194_304, 4096, 1024.0, 1.0, 0.0012, 0.04812, None),
    "gpu-0.32-ready.log": (864_832, 4096, 211.14, 105.57, 14.99, 7.204311, 0.53),
    "gpu-0.32-host-tier.log": (12_582_912, 131_072, 96.0, 61.2, None, None, None),
    "xpu-0.32-ready.log": (331_776, 8192, 40.5, 40.5, None, None, None),
    "gpu-0.10-two-line.log": (2_251_456, 32_768, 68.71, 60.12, 7.1441, 4.221935, 0.62),
    "gpu-0.8-two-line.log": (408_112, 8192, 49.82, 49.82, 14.9889, 5.343125, 0.53),
}


@pytest.mark.parametrize("name", sorted(CAPACITY_CASES))
def test_parse_capacity_reads_every_known_format(name: str) -> None:
    tokens, max_len, concurrency, available, weights, load_s, graph = CAPACITY_CASES[name]
    capacity = parse_capacity(log(name))
    assert capacity.kv_cache_tokens == tokens
    assert capacity.max_model_len == max_len
    assert capacity.max_concurrency_reported == pytest.approx(concurrency)
    assert capacity.available_kv_cache_gib == available
    assert capacity.model_weights_gib == weights
    assert capacity.model_load_s == load_s
    assert capacity.cuda_graph_gib == graph
    assert capacity.source == "log"


def test_v0_gpu_blocks_become_tokens_with_the_block_size() -> None:
    capacity = parse_capacity(log("gpu-v0-blocks.log"), block_size=16)
    assert capacity.num_gpu_blocks == 7474
    assert capacity.kv_cache_tokens == 7474 * 16
    assert capacity.block_size == 16
    assert capacity.model_weights_gib == 12.5523  # "Loading model weights took X GB"
    assert capacity.source == "log"


def test_v0_gpu_blocks_without_a_block_size_give_no_token_count() -> None:
    capacity = parse_capacity(log("gpu-v0.6-blocks-concurrency.log"))
    assert capacity.num_gpu_blocks == 27_487
    assert capacity.kv_cache_tokens is None
    assert capacity.source is None
    assert (capacity.max_model_len, capacity.max_concurrency_reported) == (8192, 53.69)


def test_a_log_without_capacity_lines_gives_an_empty_capacity() -> None:
    assert parse_capacity(log("crash-killed.log")) == Capacity()


def test_negative_available_kv_memory_is_read_with_its_sign() -> None:
    assert parse_capacity(log("fail-no-kv-memory.log")).available_kv_cache_gib == -3.41


def test_numbers_with_thousands_separators_and_colour_codes() -> None:
    text = (
        "\x1b[32m(EngineCore_DP0 pid=1) INFO 01-02 03:04:05 [kv_cache_utils.py:1] \x1b[0m"
        "GPU KV cache size: 1,234,567 tokens, Maximum concurrency for 4,096 tokens per request: 1,234.50x\n"
    )
    capacity = parse_capacity(text)
    assert capacity.kv_cache_tokens == 1_234_567
    assert capacity.max_concurrency_reported == 1234.5
    assert kv_cache_device(text) == "GPU"


@pytest.mark.parametrize(
    ("name", "device"),
    [("cpu-0.32-ready.log", "CPU"), ("gpu-0.32-host-tier.log", "GPU"), ("xpu-0.32-ready.log", "XPU"), ("crash-killed.log", None)],
)
def test_kv_cache_device(name: str, device: str | None) -> None:
    assert kv_cache_device(log(name)) == device


@pytest.mark.parametrize(
    ("name", "address", "version"),
    [
        ("real-0.32-cpu-ok.log", "http://127.0.0.1:52809", "0.32.0"),
        ("gpu-0.10-two-line.log", "http://0.0.0.0:8000", "0.10.1.1"),
        ("gpu-0.8-two-line.log", "http://0.0.0.0:8000", "0.8.5"),
        ("gpu-v0-blocks.log", "http://0.0.0.0:8000", "0.5.0.post1"),
        ("timeout-stuck-loading.log", None, None),
    ],
)
def test_ready_address_and_version(name: str, address: str | None, version: str | None) -> None:
    text = log(name)
    assert ready_address(text) == address
    assert parse_version(text) == version


def test_version_line_of_the_server_version_form() -> None:
    assert parse_version("(APIServer pid=1) INFO 01-02 03:04:05 [utils.py:1] vLLM server version 0.20.1, serving model m") == "0.20.1"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("(APIServer pid=9886) INFO 12-02 15:09:20 [entry.py:140] Starting vLLM server on http://x", "Starting vLLM server on http://x"),
        ("(VllmWorker TP0 pid=2051) WARNING 08-11 14:03:02 [gpu.py:2] careful", "careful"),
        ("INFO 06-03 07:44:58 gpu_executor.py:83] # GPU blocks: 7,474", "# GPU blocks: 7,474"),
        ("vllm-1  | (EngineCore_DP0 pid=7) ERROR 07-20 10:01:44 [core.py:1510] boom", "boom"),
        ("(EngineCore pid=6170) ValueError: bad", "ValueError: bad"),
        ("INFO:     Application startup complete.", "INFO:     Application startup complete."),
    ],
)
def test_clean_line_removes_the_prefix(line: str, message: str) -> None:
    assert clean_line(line) == message


# name -> (kind, estimated_max_model_len, words the message must contain)
FAILURE_CASES = {
    "real-0.32-cpu-kv-too-small.log": ("kv_too_small", 896, "max seq len (2048)"),
    "real-0.32-cpu-bad-flag.log": ("bad_flag", None, "api_server.py: error: unrecognized arguments: --swap-space"),
    "real-0.32-cpu-max-model-len-too-long.log": ("max_model_len_too_long", None, "User-specified max_model_len (16384)"),
    "real-0.32-cpu-master-port-taken.log": ("master_port_taken", None, "port: 36191, useIpv6: false, code: -98, name: EADDRINUSE"),
    "fail-kv-too-small.log": ("kv_too_small", 896, "max seq len (2048)"),
    "fail-kv-too-small-0.8.log": ("kv_too_small", 20544, "models's max seq len (32768)"),
    "fail-kv-too-small-no-estimate.log": ("kv_too_small", None, "max seq len (131072)"),
    "fail-no-kv-memory.log": ("no_kv_memory", None, "No available memory for the cache blocks"),
    "fail-gpu-oom-free-memory.log": ("gpu_oom", None, "Free memory on device cuda:0"),
    "fail-gpu-oom-load.log": ("gpu_oom", None, "Failed to load model - not enough GPU memory"),
    "fail-gpu-oom-sampler.log": ("gpu_oom", None, "when warming up sampler with 1024 dummy requests"),
    "fail-cpu-kv-ram.log": ("gpu_oom", None, "Available memory on node 0"),
    "fail-world-size.log": ("world_size_too_large", None, "World size (4) is larger than the number of available GPUs (2)"),
    "fail-heads-not-divisible.log": ("heads_not_divisible", None, "attention heads (28) must be divisible by tensor parallel size (3)"),
    "fail-max-model-len.log": ("max_model_len_too_long", None, "User-specified max_model_len (8192)"),
    "fail-bad-flag-unrecognized.log": ("bad_flag", None, "unrecognized arguments: --swap-space 4"),
    "fail-bad-flag-invalid-choice.log": ("bad_flag", None, "invalid choice: 'fp7'"),
    "fail-bad-flag-invalid-value.log": ("bad_flag", None, "argument --max-model-len"),
}


@pytest.mark.parametrize("name", sorted(FAILURE_CASES))
def test_classify_failure_finds_the_root_cause(name: str) -> None:
    kind, estimated, words = FAILURE_CASES[name]
    failure = classify_failure(log(name), exit_code=1, timed_out=False)
    assert failure.kind == kind
    assert failure.estimated_max_model_len == estimated
    assert words in failure.message
    assert failure.exit_code == 1
    # The message is the root-cause line itself: no log prefix, no exception class, no wrapper.
    assert "pid=" not in failure.message
    assert not failure.message.startswith(("ValueError", "RuntimeError", "Value error"))
    assert "Engine core initialization failed" not in failure.message
    assert failure.log_tail == [line.rstrip() for line in log(name).splitlines()[-20:]]


def test_the_root_cause_wins_over_a_timeout() -> None:
    failure = classify_failure(log("timeout-engine-died.log"), exit_code=None, timed_out=True)
    assert failure.kind == "no_kv_memory"


def test_timeout_without_a_cause_names_the_last_line_and_the_limit() -> None:
    failure = classify_failure(log("timeout-stuck-loading.log"), exit_code=None, timed_out=True, startup_timeout_s=900)
    assert failure.kind == "timeout"
    assert failure.message.startswith("not ready within 900 s; last log line: Loading safetensors checkpoint shards")
    assert failure.exit_code is None


def test_timeout_with_an_empty_log() -> None:
    failure = classify_failure("", exit_code=None, timed_out=True)
    assert (failure.kind, failure.message, failure.log_tail) == ("timeout", "not ready; the log is empty", [])


def test_crash_reports_the_last_error_not_the_wrapper() -> None:
    failure = classify_failure(log("crash-engine-wrapper-only.log"), exit_code=1, timed_out=False)
    assert failure.kind == "crashed"
    assert failure.message == (
        "the server exited with code 1; last error: "
        "NotImplementedError: Unsupported attention backend for head size 80 on CPU."
    )


def test_a_max_model_len_warning_is_not_a_cause() -> None:
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 turns the error into a WARNING line; the crash came later.
    failure = classify_failure(log("warn-max-model-len-then-crash.log"), exit_code=-11, timed_out=False)
    assert failure.kind == "crashed"
    assert failure.message == "the server was killed by SIGSEGV; last error: Fatal Python error: Segmentation fault"


def test_killed_by_sigkill_hints_at_the_oom_killer() -> None:
    failure = classify_failure(log("crash-killed.log"), exit_code=-9, timed_out=False)
    assert failure.kind == "crashed"
    assert failure.message.startswith("the server was killed by SIGKILL (the kernel's out-of-memory killer")
    assert failure.message.endswith("last log line: Starting to load model .cache/tiny-llama...")
    assert len(failure.log_tail) == 3


def test_log_tail_keeps_the_last_20_lines() -> None:
    text = "\n".join(f"line {i}" for i in range(50))
    failure = classify_failure(text, exit_code=3, timed_out=False)
    assert failure.log_tail == [f"line {i}" for i in range(30, 50)]
    assert failure.message == "the server exited with code 3; last log line: line 49"


# -- /metrics --------------------------------------------------------------------------------


def test_cache_config_labels_from_real_metrics() -> None:
    labels = cache_config_labels((METRICS / "real-0.32-cpu-idle.txt").read_text(encoding="utf-8"))
    assert labels is not None
    assert labels["kv_cache_size_tokens"] == "8192"
    assert labels["num_gpu_blocks"] == "64"
    assert labels["block_size"] == "128"
    assert labels["kv_cache_max_concurrency"] == "4.0"


def test_cache_config_labels_absent() -> None:
    assert cache_config_labels("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n") is None
    assert cache_config_labels("") is None


def test_cache_config_labels_takes_engine_0_of_several() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{engine="1",kv_cache_size_tokens="200"} 1.0\n'
        'vllm:cache_config_info{engine="0",kv_cache_size_tokens="100"} 1.0\n'
    )
    assert cache_config_labels(text) == {"engine": "0", "kv_cache_size_tokens": "100"}


def test_log_and_real_metrics_agree() -> None:
    capacity = parse_capacity(log("real-0.32-cpu-ok.log"))
    labels = cache_config_labels((METRICS / "real-0.32-cpu-busy.txt").read_text(encoding="utf-8"))
    merged = merge_cache_config(capacity, labels)
    assert merged.source == "log+metrics"
    assert (merged.kv_cache_tokens, merged.num_gpu_blocks, merged.block_size) == (8192, 64, 128)
    assert merged.log_kv_cache_tokens is None and merged.metrics_kv_cache_tokens is None
    assert capacity.source == "log"  # the input is not changed


def test_real_preempted_run_agrees_with_its_metrics() -> None:
    capacity = parse_capacity(log("real-0.32-cpu-preempted.log"))
    merged = merge_cache_config(capacity, cache_config_labels((METRICS / "real-0.32-cpu-preempted.txt").read_text(encoding="utf-8")))
    assert (merged.kv_cache_tokens, merged.num_gpu_blocks, merged.source) == (4096, 32, "log+metrics")


def test_metrics_only() -> None:
    labels = {"kv_cache_size_tokens": "4194304", "kv_cache_max_concurrency": "4096.0", "num_gpu_blocks": "32768", "block_size": "128"}
    merged = merge_cache_config(Capacity(), labels)
    assert merged.source == "metrics"
    assert merged.kv_cache_tokens == 4_194_304
    assert merged.max_concurrency_reported == 4096.0
    assert (merged.num_gpu_blocks, merged.block_size) == (32768, 128)


def test_disagreement_keeps_both_and_uses_the_smaller() -> None:
    capacity = Capacity(kv_cache_tokens=10_000, source="log")
    merged = merge_cache_config(capacity, {"kv_cache_size_tokens": "8192"})
    assert (merged.log_kv_cache_tokens, merged.metrics_kv_cache_tokens) == (10_000, 8192)
    assert (merged.kv_cache_tokens, merged.source) == (8192, "metrics")
    merged = merge_cache_config(Capacity(kv_cache_tokens=100, source="log"), {"kv_cache_size_tokens": "8192"})
    assert (merged.kv_cache_tokens, merged.source) == (100, "log")


def test_metrics_blocks_times_block_size_when_tokens_are_not_labelled() -> None:
    # Older cache_config_info had num_gpu_blocks and block_size but no kv_cache_size_tokens.
    capacity = parse_capacity(log("gpu-v0-blocks.log"))
    merged = merge_cache_config(capacity, {"num_gpu_blocks": "7474", "block_size": "16", "kv_cache_size_tokens": "None"})
    assert (merged.kv_cache_tokens, merged.source) == (7474 * 16, "metrics")


def test_no_labels_changes_nothing() -> None:
    capacity = parse_capacity(log("cpu-0.32-ready.log"))
    assert merge_cache_config(capacity, None) == capacity
    assert merge_cache_config(capacity, {}) == capacity
