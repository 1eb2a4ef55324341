"""Weight bytes from safetensors headers: exact, without reading any tensor data.

A .safetensors file is an 8-byte little-endian header length N, N bytes of JSON mapping each
tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, then the data. Every tensor is
counted, so quantised checkpoints come out right: GPTQ/AWQ's packed int32 `qweight`/`qzeros`,
their `scales` and `g_idx`, FP8 weights and their scales.

Per GPU under tensor parallelism, vLLM splits linear layers and the vocabulary across ranks,
replicates norms and other 1-D tensors, and replicates K/V projections when there are fewer KV
heads than ranks (each rank keeps max(1, kv_heads // tp) of them). The result is a lower bound:
vLLM may pad the vocabulary, repack quantised weights for its kernels, or keep a copy in
another layout while loading.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from planner.errors import EstimateError

# Bits per element of each safetensors dtype.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip

# A header is JSON for every tensor name; 100 MB covers checkpoints with millions of tensors.
MAX_HEADER_BYTES = 100_000_000
_KV_PROJ = re.compile(r"(^|\.)(k_proj|v_proj)\.")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str


@dataclass(frozen=True)
class Weights:
    total_bytes: int
    tensors: int
    files: int
    # "safetensors" (exact, from headers) or "config" (parameter count x dtype bytes).
    source: str
    per_gpu_bytes: int
    parameters: int | None = None


def header_length(head: bytes, where: str) -> int:
    """The JSON header's length from a file's first 8 bytes, checked for plausibility."""
    if len(head) < 8:
        raise EstimateError(f"{where}: too short for a safetensors file ({len(head)} bytes)")
    (length,) = struct.unpack("<Q", head[:8])
    if length > MAX_HEADER_BYTES:
        raise EstimateError(f"{where}: header length {length} is implausible; not a safetensors file?")
    return length


def parse_header(raw: bytes, where: str, file: str) -> list[TensorInfo]:
    """The tensors a safetensors JSON header declares, with their byte sizes checked against the offsets."""
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EstimateError(f"{where}: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise EstimateError(f"{where}: header is not a JSON object")
    tensors = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise EstimateError(f"{where}: tensor {name!r} lacks dtype, shape or data_offsets") from None
        bits = DTYPE_BITS.get(dtype)
        if bits is None:
            raise EstimateError(f"{where}: tensor {name!r} has unknown dtype {dtype!r}; known: {', '.join(DTYPE_BITS)}")
        nbytes = math.ceil(math.prod(shape) * bits / 8)
        if end - begin != nbytes:
            raise EstimateError(f"{where}: tensor {name!r} is {dtype}{list(shape)} = {nbytes} bytes but its offsets span {end - begin}")
        tensors.append(TensorInfo(name=name, dtype=dtype, shape=shape, nbytes=nbytes, file=file))
    return tensors


def read_header(path: str | Path) -> list[TensorInfo]:
    """The tensors one local .safetensors file declares; only its header is read."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            length = header_length(f.read(8), str(p))
            raw = f.read(length)
    except OSError as exc:
        raise EstimateError(f"cannot read {p}: {exc.strerror or exc}") from None
    if len(raw) < length:
        raise EstimateError(f"{p}: header says {length} bytes but the file ends after {len(raw)}")
    return parse_header(raw, str(p), p.name)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The .safetensors files of a model folder: those the index names, else every one there."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EstimateError(f"{index}: not a safetensors index (needs weight_map): {exc}") from None
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise EstimateError(f"{index} names files that are not there: {', '.join(missing[:5])}")
        return [model_dir / n for n in names]
    return sorted(model_dir.glob("*.safetensors"))


def per_gpu_bytes(tensors: list[TensorInfo], tp: int, num_kv_heads: int | None) -> int:
    """Bytes one tensor-parallel rank holds of these tensors."""
    if tp <= 1:
        return sum(t.nbytes for t in tensors)
    total = 0.0
    for t in tensors:
        if len(t.shape) <= 1:
            total += t.nbytes
        elif num_kv_heads and num_kv_heads < tp and _KV_PROJ.search(t.name):
            # Each rank keeps one whole KV head of the num_kv_heads there are.
            total += t.nbytes / num_kv_heads
        else:
            total += t.nbytes / tp
    return math.ceil(total)


def tensor_weights(tensors: list[TensorInfo], files: int, tp: int, num_kv_heads: int | None) -> Weights:
    """Exact weights of a checkpoint's tensors (read from its safetensors headers)."""
    return Weights(
        total_bytes=sum(t.nbytes for t in tensors),
        tensors=len(tensors),
        files=files,
        source="safetensors",
        per_gpu_bytes=per_gpu_bytes(tensors, tp, num_kv_heads),
    )


def checkpoint_weights(model_dir: Path, tp: int, num_kv_heads: int | None) -> Weights | None:
    """Exact weights of the folder's safetensors checkpoint, or None when it has none."""
    files = checkpoint_files(model_dir)
    if not files:
        return None
    return tensor_weights([t for f in files for t in read_header(f)], len(files), tp, num_kv_heads)


def config_weights(parameters: int, bytes_per_parameter: float, tp: int) -> Weights:
    """Weights from a parameter count when only config.json is there: an estimate, split evenly."""
    total = math.ceil(parameters * bytes_per_parameter)
    return Weights(
        total_bytes=total,
        tensors=0,
        files=0,
        source="config",
        per_gpu_bytes=math.ceil(total / tp),
        parameters=parameters,
    )
