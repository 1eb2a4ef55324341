"""What a run measured: the server's software, the model, the hardware, the corpus and the SLOs.

Capacity belongs to one exact configuration, so every results file records it beside the
settings, and `planner compare` lists what differs between two runs before anything else.
The models here are pure data; `differences` is a pure function of two of them. What only the
planner can learn (nvidia-smi, the server's command line) is collected in planner.identity and
handed in; the replay fills in what the server itself tells (its version).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

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
    dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None


class Hardware(_Model):
    # "gpu" (nvidia-smi answered) or "cpu" (the CPU build, or a machine without nvidia-smi).
    kind: str
    model: str | None = None
    count: int = 0
    memory_mib: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    cpu_model: str | None = None
    # "local": this machine, where the planner started the server; "client": the machine the
    # replay ran on, which may not be the server's.
    seen_from: str = "local"


class Identity(_Model):
    planner_version: str | None = None
    vllm_version: str | None = None
    # What the server says of its build beyond the version (vLLM's /version has only the version).
    vllm_build: str | None = None
    model: ModelIdentity = Field(default_factory=ModelIdentity)
    # The server's command-line flags (secrets redacted) and the environment variables set for it;
    # None when the planner did not start the server (`planner replay` against a URL).
    server_command: list[str] | None = None
    server_flags: list[str] | None = None
    server_env: dict[str, str] | None = None
    hardware: Hardware | None = None
    corpus_sha256: str | None = None
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


def flag_values(flags: list[str] | None) -> dict[str, str]:
    """`--name value`, `--name=value` and bare `--switch` (value "on") from a command line."""
    out: dict[str, str] = {}
    if not flags:
        return out
    i = 0
    while i < len(flags):
        item = flags[i]
        if item.startswith("--"):
            name, eq, value = item.partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(flags) and not flags[i + 1].startswith("--"):
                out[name] = flags[i + 1]
                i += 1
            else:
                out[name] = "on"
        i += 1
    return out


def _text(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _short(digest: str | None) -> str:
    return "(unknown)" if digest is None else digest[:12]


def _change(label: str, before: Any, after: Any) -> str:
    return f"{label} {_text(before)} -> {_text(after)}"


def _hardware_text(hw: Hardware | None) -> str | None:
    if hw is None:
        return None
    if hw.kind == "gpu":
        memory = f" {hw.memory_mib // 1024} GiB" if hw.memory_mib else ""
        return f"{hw.count} x {hw.model or 'GPU'}{memory}"
    return f"CPU {hw.cpu_model or '(unknown model)'}"


def differences(base: Identity | None, new: Identity | None) -> list[str]:
    """What changed between two runs' identities, most decisive first, one short phrase each;
    the corpus is always named (changed or unchanged). Unknown on both sides is no change."""
    if base is None or new is None:
        return ["identity unknown (a results file from before identities were recorded)"]
    out: list[str] = []
    if base.vllm_version != new.vllm_version:
        out.append(_change("vLLM", base.vllm_version, new.vllm_version))
    if base.vllm_build != new.vllm_build:
        out.append(_change("vLLM build", base.vllm_build, new.vllm_build))
    bm, nm = base.model, new.model
    if bm.name != nm.name:
        out.append(_change("model", bm.name, nm.name))
    if bm.revision != nm.revision:
        out.append(_change("model revision", bm.revision, nm.revision))
    elif bm.sha256 != nm.sha256 and bm.name == nm.name:
        out.append(f"model files {_short(bm.sha256)} -> {_short(nm.sha256)}")
    for field in ("dtype", "quantization", "kv_cache_dtype", "max_model_len"):
        before, after = getattr(bm, field), getattr(nm, field)
        if before != after:
            out.append(_change(field.replace("_", " "), before, after))
    if base.server_command is not None and new.server_command is not None and base.server_command != new.server_command:
        out.append(_change("server command", " ".join(base.server_command), " ".join(new.server_command)))
    bf, nf = flag_values(base.server_flags), flag_values(new.server_flags)
    for name in sorted(set(bf) | set(nf)):
        if bf.get(name) != nf.get(name):
            out.append(_change(name, bf.get(name), nf.get(name)))
    be, ne = base.server_env or {}, new.server_env or {}
    for name in sorted(set(be) | set(ne)):
        if be.get(name) != ne.get(name):
            out.append(_change(f"env {name}", be.get(name), ne.get(name)))
    bh, nh = _hardware_text(base.hardware), _hardware_text(new.hardware)
    if bh != nh:
        out.append(_change("hardware", bh, nh))
    elif base.hardware and new.hardware:
        for field in ("driver_version", "cuda_version"):
            before, after = getattr(base.hardware, field), getattr(new.hardware, field)
            if before != after:
                out.append(_change(field.replace("_version", "").replace("cuda", "CUDA"), before, after))
    for key in sorted(set(base.slo) | set(new.slo)):
        if base.slo.get(key) != new.slo.get(key):
            out.append(_change(f"SLO {key}", base.slo.get(key), new.slo.get(key)))
    if base.planner_version != new.planner_version:
        out.append(_change("planner", base.planner_version, new.planner_version))
    if base.corpus_sha256 == new.corpus_sha256:
        out.append("corpus unchanged")
    else:
        out.append(f"corpus {_short(base.corpus_sha256)} -> {_short(new.corpus_sha256)}")
    return out
