"""What a run measured: the server's software, the model, the hardware, the corpus and the SLOs.

Capacity belongs to one exact configuration, so every results file records it beside the
settings, and `planner compare` lists what differs between two runs before anything else.
The models here are pure data (planner.compare.identity lists the differences between two). What
only the planner can learn (nvidia-smi, the server's command line) is collected in
planner.identity and handed in; the replay fills in what the server itself tells (its version)
and, when the served model's folder is on this machine, its files' hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# Files whose names and sizes identify a checkpoint's weights (their bytes are not read: a
# 140 GB model would take minutes to hash, and a changed weight file changes its size or name
# in every real re-release).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# Tokenizer and generation files change what the server does without touching the weights.
HASHED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ModelIdentity(_Model):
    # As given to the server (a folder, a Hub name) or as it serves it.
    name: str | None = None
    # The Hub commit, when the model came from the Hub at a known revision.
    revision: str | None = None
    # sha256 of config.json (and the tokenizer and generation files) and of every weight file's
    # name and size; None when the planner could not read the model's folder.
    sha256: str | None = None
    # config.json's torch_dtype, overridden by --dtype.
    dtype: str | None = None
    # config.json's quantization_config.quant_method, overridden by --quantization.
    quantization: str | None = None
    # --kv-cache-dtype.
    kv_cache_dtype: str | None = None
    # --max-model-len.
    max_model_len: int | None = None


class Hardware(_Model):
    # "gpu" (nvidia-smi answered) or "cpu" (the CPU build, or a machine without nvidia-smi).
    kind: str
    # The GPU's (nvidia-smi's name) or CPU's model.
    model: str | None = None
    # How many GPUs.
    count: int = 0
    # Memory per GPU in MiB.
    memory_mib: int | None = None
    # NVIDIA's driver version (nvidia-smi).
    driver_version: str | None = None
    # The CUDA version the driver supports (nvidia-smi).
    cuda_version: str | None = None
    # The CPU's model.
    cpu_model: str | None = None
    # "local": this machine, where the planner started the server; "client": the machine the
    # replay ran on, which may not be the server's.
    seen_from: str = "local"


class Identity(_Model):
    # The planner's version.
    planner_version: str | None = None
    # vLLM's version: a sweep asks the server command before the first point (else what the servers
    # said); a replay reads the server's /version.
    vllm_version: str | None = None
    # What the server says of its build beyond the version (vLLM's /version has only the version).
    vllm_build: str | None = None
    # The model measured.
    model: ModelIdentity = Field(default_factory=ModelIdentity)
    # The server's command-line flags (secrets redacted) and the environment variables set for it;
    # None when the planner did not start the server (`planner replay` against a URL).
    server_command: list[str] | None = None
    # [server] args, secrets redacted; a point's own flags are its config (null for planner replay).
    server_flags: list[str] | None = None
    # [server] env, secrets redacted (null for planner replay).
    server_env: dict[str, str] | None = None
    # What it ran on; with the Ray executor, the driver's (each point's gpu_model says where it
    # ran).
    hardware: Hardware | None = None
    # The corpus's SHA-256.
    corpus_sha256: str | None = None
    # The SLO bounds.
    slo: dict[str, float] = Field(default_factory=dict)


def model_fingerprint(folder: Path) -> str | None:
    """sha256 over config.json (and tokenizer and generation files) and the weight files' names
    and sizes, in name order; None when `folder` has no config.json."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return None
    digest = hashlib.sha256()
    for name in HASHED_FILES:
        path = folder / name
        if path.is_file():
            digest.update(f"{name}\0".encode())
            digest.update(path.read_bytes())
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name.endswith(WEIGHT_SUFFIXES):
            digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0".encode())
    return digest.hexdigest()


def model_config_facts(folder: Path) -> dict[str, str]:
    """dtype and quantisation method from a model folder's config.json (those it states)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    out = {}
    dtype = config.get("torch_dtype") or config.get("dtype")
    if isinstance(dtype, str):
        out["dtype"] = dtype
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        out["quantization"] = quant["quant_method"]
    return out
