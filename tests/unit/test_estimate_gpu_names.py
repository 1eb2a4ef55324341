"""GPU names as people and nvidia-smi write them find the catalogue's entry."""

from __future__ import annotations

import pytest

from planner.errors import ConfigError
from planner.estimate.gpu_catalog import lookup
from planner.estimate.hub import vllm_model_flags


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("H100", "h100-80gb"), ("h100-sxm", "h100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA H100 PCIe", "h100-80gb"),
        ("A100-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100 80GB PCIe", "a100-80gb"), ("a100_40g", "a100-40gb"),
        ("L40S", "l40s"), ("NVIDIA L4", "l4"), ("NVIDIA A10G", "a10g"), ("NVIDIA H200", "h200-141gb"),
        ("MI300X", "mi300x"), ("AMD Instinct MI300X", "mi300x"), ("b200", "b200"),
    ],
)  # fmt: skip
def test_gpu_names_as_written(name, entry):
    assert lookup(name).name == entry


def test_an_unknown_gpu_lists_the_known_ones():
    # An H100 NVL has 94 GB: it must not be taken for the 80 GB part.
    with pytest.raises(ConfigError) as err:
        lookup("NVIDIA H100 NVL")
    message = str(err.value)
    assert message.startswith("--gpu 'NVIDIA H100 NVL' is not in the catalogue; known: l4 (NVIDIA L4 24 GB); a10g (NVIDIA A10G 24 GB);")
    assert message.endswith("mi300x (AMD Instinct MI300X 192 GB). nvidia-smi's names work too (NVIDIA H100 80GB HBM3); for another GPU give --gpu-memory-gib")


def test_a_revision_becomes_vllms_revision_flag(tmp_path):
    assert vllm_model_flags("org/name@v1.0") == ["--model", "org/name", "--revision", "v1.0"]
    assert vllm_model_flags("org/name") == ["--model", "org/name"]
    assert vllm_model_flags(str(tmp_path)) == ["--model", str(tmp_path)]
