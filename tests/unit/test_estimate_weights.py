"""Weights from safetensors headers, checked against the bytes actually written."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from planner.errors import EstimateError
from planner.estimate.weights import checkpoint_weights, per_gpu_bytes, read_header


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> int:
    """Write a safetensors file by hand; returns the bytes of tensor data written."""
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, (dtype, array) in tensors.items():
        data = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return offset


def bf16(*shape: int) -> np.ndarray:
    # bf16 has no numpy dtype; its bytes are two per element, which uint16 reproduces.
    return np.zeros(shape, dtype=np.uint16)


def data_bytes(path: Path) -> int:
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    return path.stat().st_size - 8 - length


def test_bf16_checkpoint_exact_bytes(tmp_path):
    f = tmp_path / "model.safetensors"
    written = write_safetensors(
        f,
        {
            "model.embed_tokens.weight": ("BF16", bf16(512, 64)),
            "model.layers.0.self_attn.q_proj.weight": ("BF16", bf16(64, 64)),
            "model.layers.0.self_attn.k_proj.weight": ("BF16", bf16(32, 64)),
            "model.layers.0.self_attn.v_proj.weight": ("BF16", bf16(32, 64)),
            "model.layers.0.input_layernorm.weight": ("BF16", bf16(64)),
            "lm_head.weight": ("F32", np.zeros((512, 64), dtype=np.float32)),
        },
    )
    w = checkpoint_weights(tmp_path, tp=1, num_kv_heads=2)
    assert w is not None and w.source == "safetensors"
    assert w.total_bytes == written == data_bytes(f)
    assert w.tensors == 6 and w.files == 1


def test_int4_gptq_checkpoint_counts_packed_weights_scales_and_zeros(tmp_path):
    in_f, out_f, group = 256, 128, 64
    tensors = {
        # GPTQ packs eight 4-bit weights per int32 along the input dimension.
        "model.layers.0.mlp.down_proj.qweight": ("I32", np.zeros((in_f // 8, out_f), dtype=np.int32)),
        "model.layers.0.mlp.down_proj.qzeros": ("I32", np.zeros((in_f // group, out_f // 8), dtype=np.int32)),
        "model.layers.0.mlp.down_proj.scales": ("F16", np.zeros((in_f // group, out_f), dtype=np.float16)),
        "model.layers.0.mlp.down_proj.g_idx": ("I32", np.zeros((in_f,), dtype=np.int32)),
    }
    shard1 = tmp_path / "model-00001-of-00002.safetensors"
    shard2 = tmp_path / "model-00002-of-00002.safetensors"
    items = list(tensors.items())
    written = write_safetensors(shard1, dict(items[:2])) + write_safetensors(shard2, dict(items[2:]))
    # A stray file not in the index must not be counted.
    write_safetensors(tmp_path / "extra.safetensors", {"x": ("F32", np.zeros((1000,), dtype=np.float32))})
    index = {"metadata": {}, "weight_map": {name: (shard1 if i < 2 else shard2).name for i, name in enumerate(tensors)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))

    w = checkpoint_weights(tmp_path, tp=1, num_kv_heads=None)
    assert w.total_bytes == written == data_bytes(shard1) + data_bytes(shard2)
    # 256 x 128 4-bit weights are 16 KiB; scales, zeros and g_idx come on top.
    assert w.total_bytes == 256 * 128 // 2 + 4 * 16 * 4 + 4 * 128 * 2 + 256 * 4
    assert w.files == 2


def test_tensor_parallel_split_replicates_norms_and_scarce_kv_heads(tmp_path):
    f = tmp_path / "model.safetensors"
    write_safetensors(
        f,
        {
            "model.layers.0.self_attn.q_proj.weight": ("BF16", bf16(64, 64)),  # 8192 bytes
            "model.layers.0.self_attn.k_proj.weight": ("BF16", bf16(32, 64)),  # 4096, 2 KV heads
            "model.layers.0.input_layernorm.weight": ("BF16", bf16(64)),  # 128, replicated
        },
    )
    tensors = read_header(f)
    assert per_gpu_bytes(tensors, tp=2, num_kv_heads=2) == 8192 // 2 + 4096 // 2 + 128
    # 4 ranks but 2 KV heads: each rank holds one whole head of k_proj.
    assert per_gpu_bytes(tensors, tp=4, num_kv_heads=2) == 8192 // 4 + 4096 // 2 + 128


def test_offsets_that_disagree_with_the_shape_are_an_error(tmp_path):
    f = tmp_path / "bad.safetensors"
    header = json.dumps({"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 16]}}).encode()
    f.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with pytest.raises(EstimateError, match=r"'w' is F16\[4, 4\] = 32 bytes but its offsets span 16"):
        read_header(f)


def test_truncated_file_is_an_error(tmp_path):
    f = tmp_path / "short.safetensors"
    f.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(EstimateError, match="header says 1000 bytes"):
        read_header(f)


def test_folder_without_safetensors_has_no_checkpoint(tmp_path):
    assert checkpoint_weights(tmp_path, tp=1, num_kv_heads=8) is None
