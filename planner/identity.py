"""Collect what a run measures on (replay.identity.Identity): the hardware from nvidia-smi (or
the CPU's model for the CPU build), the model's files, the server's flags and environment.

Never fails a run: what cannot be read is recorded as unknown (None).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from planner import __version__
from planner.estimate.hub import HUB_NAME
from planner.redaction import redact, redact_env
from planner.vllm_args import fixed_flags
from replay.identity import Hardware, Identity, ModelIdentity, model_config_facts, model_fingerprint

NVIDIA_SMI = "nvidia-smi"
_TIMEOUT_S = 10.0
_GPU_QUERY = "name,memory.total,driver_version"
# vLLM's flags (underscore form) that say what the model computes in and what it is.
_MODEL_FLAGS = ("dtype", "quantization", "kv_cache_dtype", "revision")


def _run(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_gpu_query(text: str, header: str | None) -> Hardware | None:
    """nvidia-smi's `--query-gpu=name,memory.total,driver_version` rows, plus the CUDA version
    from its banner (`CUDA Version: 12.4`), as one Hardware (the first GPU's model and memory)."""
    rows = [[f.strip() for f in line.rsplit(",", 2)] for line in text.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) == 3]
    if not rows:
        return None
    name, memory, driver = rows[0]
    cuda = None
    if header and "CUDA Version:" in header:
        cuda = header.split("CUDA Version:", 1)[1].split()[0].strip("|") or None
    return Hardware(
        kind="gpu",
        model=name,
        count=len(rows),
        memory_mib=int(float(memory)) if memory.replace(".", "", 1).isdigit() else None,
        driver_version=driver or None,
        cuda_version=cuda,
    )


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def hardware(*, use_gpus: bool = True, seen_from: str = "local", nvidia_smi: str = NVIDIA_SMI) -> Hardware:
    """This machine's GPUs (nvidia-smi) or, without them, its CPU."""
    executable = shutil.which(nvidia_smi) if use_gpus else None
    if executable is not None:
        rows = _run([executable, f"--query-gpu={_GPU_QUERY}", "--format=csv,noheader,nounits"])
        found = parse_gpu_query(rows, _run([executable])) if rows else None
        if found is not None:
            return found.model_copy(update={"cpu_model": cpu_model(), "seen_from": seen_from})
    return Hardware(kind="cpu", count=os.cpu_count() or 0, cpu_model=cpu_model(), seen_from=seen_from)


def model_identity(model: str | None, flags: Sequence[str] = ()) -> ModelIdentity:
    """The model as given to the server: a folder's fingerprint and config facts, or a Hub
    name's revision; the dtype flags on the command line override what config.json states."""
    out = ModelIdentity(name=model)
    if model:
        folder = Path(model)
        if folder.is_dir():
            facts = model_config_facts(folder)
            out = out.model_copy(update={"sha256": model_fingerprint(folder), **facts})
        elif (match := HUB_NAME.fullmatch(model)) is not None:
            out = out.model_copy(update={"revision": match["revision"]})
    given = fixed_flags(list(flags))
    update: dict = {k: str(given[k]) for k in _MODEL_FLAGS if isinstance(given.get(k), str)}
    if str(given.get("max_model_len", "")).isdigit():
        update["max_model_len"] = int(given["max_model_len"])
    return out.model_copy(update=update)


def server_identity(
    *,
    command: Sequence[str],
    model: str | None,
    args: Sequence[str],
    env: Mapping[str, str],
    secrets: Sequence[str] = (),
    vllm_version: str | None,
    corpus_sha256: str | None,
    slo: Mapping[str, float],
    use_gpus: bool = True,
) -> Identity:
    """The identity of a run whose server the planner starts (`planner sweep`)."""
    flags = redact(list(args), list(secrets))
    return Identity(
        planner_version=__version__,
        vllm_version=vllm_version,
        model=model_identity(model, flags),
        server_command=list(command),
        server_flags=flags,
        server_env=redact_env(dict(env)),
        hardware=hardware(use_gpus=use_gpus),
        corpus_sha256=corpus_sha256,
        slo={k: float(v) for k, v in slo.items()},
    )


def replay_identity(url: str, *, model_path: Path | None = None) -> Identity:
    """What `planner replay` knows before it connects: the planner's version, the model's files
    when given, and the hardware when the server is on this machine (else the client's)."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    local = host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")
    # The name is the served one (filled in by the replay); the folder gives the files' hash.
    model = model_identity(str(model_path)).model_copy(update={"name": None}) if model_path is not None else ModelIdentity()
    return Identity(
        planner_version=__version__,
        model=model,
        hardware=hardware(seen_from="local" if local else "client"),
    )
