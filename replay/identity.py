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

from pydantic import Field
from replay.model import ResultModel

# Files whose names and sizes identify a checkpoint's weights (their bytes are not read: a
# 140 GB model would take minutes to hash, and a changed weight file changes its size or name
# in every real re-release).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# Tokenizer and generation files change what the server does without touching the weights.
HASHED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class ModelIdentity(ResultModel):
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


class Hardware(ResultModel):
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


class Identity(ResultModel):
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


def served_model_files(identity: Identity, served: str) -> Identity:
    """vLLM serves a model folder under its path: when that folder is here, its files' hash and
    config facts identify the model (unless the caller already did)."""
    folder = Path(served)
    if identity.model.sha256 is not None or not folder.is_dir():
        return identity
    facts = {k: v for k, v in model_config_facts(folder).items() if getattr(identity.model, k) is None}
    model = identity.model.model_copy(update={"sha256": model_fingerprint(folder), **facts})
    return identity.model_copy(update={"model": model})


def measured_identity(
    known: Identity, *, served: str, vllm_version: str | None, corpus_sha256: str, slo: dict[str, float]
) -> Identity:
    """What a replay measured, from what the caller knew: the server's version and served model
    where the caller did not know them, and the corpus and the SLOs it was judged by."""
    model = known.model.model_copy(update={"name": known.model.name or served})
    return known.model_copy(
        update={
            "vllm_version": known.vllm_version or vllm_version,
            "model": model,
            "corpus_sha256": corpus_sha256,
            "slo": dict(slo),
        }
    )
