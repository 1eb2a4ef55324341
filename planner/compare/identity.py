"""What differs between two runs' identities (replay.identity.Identity), most decisive first."""

from __future__ import annotations

from typing import Any

from planner.vllm_args import fixed_flags
from replay.identity import Hardware, Identity


def _flags(flags: list[str] | None) -> dict[str, str]:
    """A command line's flags as `--name`: value ("on" for a bare switch)."""
    return {f"--{k.replace('_', '-')}": "on" if v is True else str(v) for k, v in fixed_flags(flags or []).items()}


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
    bf, nf = _flags(base.server_flags), _flags(new.server_flags)
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
