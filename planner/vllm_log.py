"""Reading a vLLM server's start-up log: the KV capacity it reports, and why it failed to start.

Pure functions on text. vLLM's log line looks like
`(EngineCore_DP0 pid=812) INFO 07-14 10:02:11 [kv_cache_utils.py:1283] message`, but the process
name, an optional VLLM_LOGGING_PREFIX and the wording around the numbers change between versions,
so every pattern here anchors on the numbers and a few stable words, never on the whole line.
Formats known (a log of each in tests/fixtures/vllm_logs/):

- 0.32:        `GPU KV cache size: 1,234,567 tokens, Maximum concurrency for 4,096 tokens per
               request: 12.34x` (device GPU/CPU/XPU, optionally `GPU + host`)
- ~0.8-0.26:   the same two figures on two lines
- V0/early V1: `# GPU blocks: N, # CPU blocks: M` (tokens = blocks x block size)
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from planner.capacity import Capacity, Failure, FailureKind

LOG_TAIL_LINES = 20

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# `LEVEL MM-DD HH:MM:SS[.fff] [file.py:123] `, optionally after `(PROC pid=N) ` and any prefix.
_PREFIX = re.compile(
    r"^.*?(?:\([^()]*\bpid=\d+\)\s+)?"
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"\d\d-\d\d\s+\d\d:\d\d:\d\d(?:[.,]\d+)?\s+"
    r"\[?[\w./\-]+:\d+\]\s?"
)
# Lines a worker process prints without the logger (tracebacks) still carry `(PROC pid=N) `.
_PROC_ONLY = re.compile(r"^.*?\([^()]*\bpid=\d+\)\s?")

_INT = r"(\d[\d,]*)"
_FLOAT = r"(-?\d[\d,]*(?:\.\d+)?)"

_KV_TOKENS = re.compile(r"KV cache size: " + _INT + r" tokens")
_KV_DEVICE_LINE = re.compile(r"\b([A-Z]+)(?: \+ host)? KV cache size:")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for " + _INT + r" tokens per request: " + _FLOAT + r"x")
_GPU_BLOCKS = re.compile(r"# GPU blocks: " + _INT)
_AVAILABLE_KV = re.compile(r"Available KV cache memory: " + _FLOAT + r" GiB")
_CPU_KV_SET = re.compile(r"(?:Explicitly|Auto) set \(" + _FLOAT + r"/" + _FLOAT + r"\) GiB for KV cache")
_MODEL_LOADING = re.compile(r"Model loading took " + _FLOAT + r" GiB(?: memory)? and " + _FLOAT + r" seconds")
_MODEL_WEIGHTS_OLD = re.compile(r"Loading model weights took " + _FLOAT + r" GB")
_GRAPH_CAPTURE = re.compile(r"Graph capturing finished in " + _FLOAT + r" secs?, took " + _FLOAT + r" GiB")
_READY = re.compile(r"Starting vLLM (?:API )?server (?:\d+ )?on (\S+)")
# 0.32 prints the version inside its ASCII-art banner (`█ ▀▄▀ █  version 0.32.0`); older ones a line.
_VERSION = re.compile(r"(?:vLLM (?:API )?server version |[█▀▄]\s+version\s+)(\d[\w.+\-]*)")

_ESTIMATED_MAX_LEN = re.compile(r"estimated maximum model length is " + _INT)

# Root causes, in the order they are tried on each line. The first line of the log that matches
# any of them is the cause; the wrapper lines that follow it ("EngineCore failed to start.") are not.
_ROOT_CAUSES: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    ("bad_flag", re.compile(r"error: unrecognized arguments:|error: argument |: invalid choice:")),
    ("kv_too_small", re.compile(r"To serve at least one request with the models?'s? max seq len")),
    ("no_kv_memory", re.compile(r"No available memory for the cache blocks")),
    (
        "gpu_oom",
        re.compile(
            r"Free memory on device .* is less than desired GPU memory utilization"
            r"|Failed to load model - not enough GPU memory"
            r"|CUDA out of memory occurred when warming up"
            r"|OutOfMemoryError: CUDA out of memory"
            # The CPU build's form: the node's free RAM cannot hold the KV cache asked for.
            r"|Available memory on node \d+ .* is less than requested memory for kv"
        ),
    ),
    ("world_size_too_large", re.compile(r"World size \(\d+\) is larger than the number of available GPUs")),
    ("heads_not_divisible", re.compile(r"number of attention heads \(\d+\) must be divisible by tensor parallel size")),
    ("max_model_len_too_long", re.compile(r"User-specified max_model_len \(\d+\) is greater than the derived")),
    # torch.distributed's TCPStore (rank 0 across nodes, or a worker on one node): another process holds its port.
    ("master_port_taken", re.compile(r"failed to listen on any local network address.*EADDRINUSE")),
    # uvicorn's bind error, or vLLM's own socket: another process holds the port.
    ("port_taken", re.compile(r"error while attempting to bind on address|\[Errno 98\] Address already in use")),
)
_WRAPPERS = re.compile(r"EngineCore failed to start|Engine core initialization failed")
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b:?|^Fatal Python error:")
# An exception's class in front of the message: "ValueError: To serve ..." -> "To serve ...".
_EXCEPTION_CLASS = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception): |^\s*Value error, ")


def clean_line(line: str) -> str:
    """The message of one log line: no colour codes, no `(PROC pid=N) LEVEL time [file:line]`."""
    line = _ANSI.sub("", line).rstrip()
    match = _PREFIX.match(line)
    if match:
        return line[match.end() :]
    return _PROC_ONLY.sub("", line)


def _level(line: str) -> str | None:
    match = _PREFIX.match(_ANSI.sub("", line))
    return match.group("level") if match else None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _float(text: str) -> float:
    return float(text.replace(",", ""))


_Field = tuple[str, Callable[[str], int | float]]
# The capacity figures of the start-up log. For each, the patterns that report it, the newest
# wording first (the first that matches is read), and the Capacity field that each of the
# pattern's groups fills (None: a group not read).
_FIGURES: tuple[tuple[tuple[re.Pattern[str], tuple[_Field | None, ...]], ...], ...] = (
    ((_KV_TOKENS, (("kv_cache_tokens", _int),)),),
    ((_MAX_CONCURRENCY, (("max_model_len", _int), ("max_concurrency_reported", _float))),),
    ((_GPU_BLOCKS, (("num_gpu_blocks", _int),)),),
    ((_AVAILABLE_KV, (("available_kv_cache_gib", _float),)), (_CPU_KV_SET, (("available_kv_cache_gib", _float),))),
    (
        (_MODEL_LOADING, (("model_weights_gib", _float), ("model_load_s", _float))),
        (_MODEL_WEIGHTS_OLD, (("model_weights_gib", _float),)),
    ),
    ((_GRAPH_CAPTURE, (None, ("cuda_graph_gib", _float))),),
)


def parse_capacity(log_text: str, block_size: int | None = None) -> Capacity:
    """The capacity figures the log reports. `block_size` turns a `# GPU blocks` count into tokens.

    Per-rank figures (model weights, available KV memory) are taken from the first rank that
    reports them; ranks of one server report the same figures.
    """
    text = _ANSI.sub("", log_text)
    capacity = Capacity(block_size=block_size)

    for alternatives in _FIGURES:
        for pattern, fields in alternatives:
            if m := pattern.search(text):
                for group, field in enumerate(fields, 1):
                    if field is not None:
                        name, convert = field
                        setattr(capacity, name, convert(m.group(group)))
                break
    if capacity.kv_cache_tokens is None and capacity.num_gpu_blocks is not None and block_size is not None:
        capacity.kv_cache_tokens = capacity.num_gpu_blocks * block_size
    if capacity.kv_cache_tokens is not None:
        capacity.source = "log"
    return capacity


def kv_cache_device(log_text: str) -> str | None:
    """The device name in front of `KV cache size:` ("GPU", "CPU", "XPU"), when the log names one."""
    match = _KV_DEVICE_LINE.search(_ANSI.sub("", log_text))
    return match.group(1) if match else None


def ready_address(log_text: str) -> str | None:
    """The address from `Starting vLLM server on http://HOST:PORT` (older: `... API server on ...`)."""
    match = _READY.search(_ANSI.sub("", log_text))
    return match.group(1) if match else None


def parse_version(log_text: str) -> str | None:
    """The version from 0.32's start-up banner, `vLLM server version X, serving model M` or the
    older `vLLM API server version X`."""
    match = _VERSION.search(_ANSI.sub("", log_text))
    return match.group(1) if match else None


def cache_config_labels(metrics_text: str) -> dict[str, str] | None:
    """The labels of `vllm:cache_config_info` (engine 0's when there are several), or None."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "vllm:cache_config_info" and family.samples:
            samples = sorted(family.samples, key=lambda s: s.labels.get("engine", ""))
            return dict(samples[0].labels)
    return None


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    # Labels hold Python reprs: "4194304", "4096.0", "None" before the engine has sized the cache.
    try:
        return int(float(labels[key]))
    except (KeyError, ValueError):
        return None


def _label_float(labels: Mapping[str, str], key: str) -> float | None:
    try:
        return float(labels[key])
    except (KeyError, ValueError):
        return None


def merge_cache_config(capacity: Capacity, labels: Mapping[str, str] | None) -> Capacity:
    """Cross-check the log's figures with `vllm:cache_config_info`; returns a new Capacity.

    source becomes "log+metrics" when both give the same token count and "metrics" when only the
    metrics have one. When they disagree both are kept (log_kv_cache_tokens, metrics_kv_cache_tokens)
    and kv_cache_tokens is the smaller, since a capacity plan must not rest on the larger figure;
    source then names where that smaller figure came from.
    """
    merged = capacity.model_copy()
    if not labels:
        return merged
    if merged.block_size is None:
        merged.block_size = _label_int(labels, "block_size")
    if merged.num_gpu_blocks is None:
        merged.num_gpu_blocks = _label_int(labels, "num_gpu_blocks")
    if merged.max_concurrency_reported is None:
        merged.max_concurrency_reported = _label_float(labels, "kv_cache_max_concurrency")

    metrics_tokens = _label_int(labels, "kv_cache_size_tokens")
    if metrics_tokens is None and merged.num_gpu_blocks is not None and merged.block_size is not None:
        metrics_tokens = merged.num_gpu_blocks * merged.block_size
    log_tokens = merged.kv_cache_tokens
    if metrics_tokens is None:
        return merged
    if log_tokens is None:
        merged.kv_cache_tokens = metrics_tokens
        merged.source = "metrics"
    elif log_tokens == metrics_tokens:
        merged.source = "log+metrics"
    else:
        merged.log_kv_cache_tokens = log_tokens
        merged.metrics_kv_cache_tokens = metrics_tokens
        merged.kv_cache_tokens = min(log_tokens, metrics_tokens)
        merged.source = "log" if log_tokens < metrics_tokens else "metrics"
    return merged


def log_tail(log_text: str, lines: int = LOG_TAIL_LINES) -> list[str]:
    return [_ANSI.sub("", line).rstrip() for line in log_text.splitlines()[-lines:]]


def _root_cause(lines: list[str]) -> tuple[FailureKind, str, int] | None:
    for number, line in enumerate(lines):
        message = clean_line(line)
        for kind, pattern in _ROOT_CAUSES:
            if not pattern.search(message):
                continue
            # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 turns the max_model_len error into a warning: not a cause.
            if _level(line) in ("WARNING", "WARN", "DEBUG", "INFO"):
                continue
            return kind, _EXCEPTION_CLASS.sub("", message).strip(), number
    return None


def _last_error_line(lines: list[str]) -> str | None:
    cleaned = [clean_line(line).strip() for line in lines]
    for message in reversed(cleaned):
        if _EXCEPTION_LINE.match(message) and not _WRAPPERS.search(message):
            return message
    for message in reversed(cleaned):
        if message:
            return message
    return None


def _exit_description(exit_code: int | None) -> str:
    if exit_code is None:
        return "the server is still running"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        hint = " (the kernel's out-of-memory killer sends SIGKILL when RAM runs out)" if exit_code == -9 else ""
        return f"the server was killed by {name}{hint}"
    return f"the server exited with code {exit_code}"


def classify_failure(
    log_text: str,
    *,
    exit_code: int | None,
    timed_out: bool,
    startup_timeout_s: float | None = None,
) -> Failure:
    """Why a server did not become ready, from its log; the root cause wins over wrapper lines."""
    lines = log_text.splitlines()
    tail = log_tail(log_text)
    cause = _root_cause(lines)
    if cause is not None:
        kind, message, number = cause
        estimated: int | None = None
        if kind == "kv_too_small":
            # The "Based on the available memory ..." sentence is only there when E > 0.
            found = _ESTIMATED_MAX_LEN.search(clean_line(lines[number]))
            estimated = _int(found.group(1)) if found else None
        return Failure(
            kind=kind, message=message, estimated_max_model_len=estimated, exit_code=exit_code, log_tail=tail
        )
    last = _last_error_line(lines)
    if timed_out:
        within = f" within {startup_timeout_s:g} s" if startup_timeout_s is not None else ""
        message = f"not ready{within}; last log line: {last}" if last else f"not ready{within}; the log is empty"
        return Failure(kind="timeout", message=message, exit_code=exit_code, log_tail=tail)
    message = _exit_description(exit_code)
    if last:
        message += f"; last error: {last}" if _EXCEPTION_LINE.match(last) else f"; last log line: {last}"
    return Failure(kind="crashed", message=message, exit_code=exit_code, log_tail=tail)
