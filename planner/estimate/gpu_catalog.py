"""Memory of common data-centre GPUs, as the driver reports it to CUDA (or ROCm).

vLLM sizes its budget from the device's total memory as torch sees it
(`torch.cuda.mem_get_info`), which is a little below the marketing figure: an "80 GB" H100
reports about 79.2 GiB. The figures below are those reported totals, rounded to 0.01 GiB, from
published vLLM and PyTorch logs where one was found (H100 79.22 GiB and A100 40 GB 39.38 GiB
appear in the logs cited in docs/guides/memory.md); the others are the marketing capacity less
the usual ECC/driver reservation, and may be off by a few hundred MiB. `--gpu-memory-gib`
overrides the catalogue, and so does PLANNER_GPU_MEMORY_GIB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.errors import ConfigError
from planner.estimate.units import GIB


@dataclass(frozen=True)
class Gpu:
    name: str
    marketing: str
    total_gib: float

    @property
    def total_bytes(self) -> int:
        return int(self.total_gib * GIB)


CATALOG: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu("l4", "NVIDIA L4 24 GB", 22.05),
        Gpu("a10g", "NVIDIA A10G 24 GB", 22.19),
        Gpu("l40s", "NVIDIA L40S 48 GB", 44.39),
        Gpu("a100-40gb", "NVIDIA A100 40 GB", 39.38),
        Gpu("a100-80gb", "NVIDIA A100 80 GB", 79.15),
        Gpu("h100-80gb", "NVIDIA H100 80 GB (SXM/PCIe)", 79.22),
        Gpu("h200-141gb", "NVIDIA H200 141 GB", 139.81),
        Gpu("b200", "NVIDIA B200 180 GB", 178.36),
        Gpu("mi300x", "AMD Instinct MI300X 192 GB", 191.98),
    )
}

# Spellings people type for the same part, after `normalise`.
ALIASES = {
    "h100": "h100-80gb",
    "h200": "h200-141gb",
    "a100": "a100-80gb",
    "a100-80": "a100-80gb",
    "a100-40": "a100-40gb",
    "b200-180gb": "b200",
    "b200-192gb": "b200",
    "l4-24gb": "l4",
    "a10g-24gb": "a10g",
    "l40s-48gb": "l40s",
    "mi300x-192gb": "mi300x",
}

# Words in GPU names (nvidia-smi's, cloud catalogues', people's) that do not change the memory.
# Not "nvl": an H100 NVL has 94 GB, so it must not be taken for the 80 GB part.
_NOISE = {"nvidia", "amd", "instinct", "tesla", "hbm3", "hbm3e", "hbm2", "hbm2e", "sxm", "sxm4", "sxm5", "pcie", "oam"}


def normalise(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` (nvidia-smi), `h100-sxm`, `A100_80GB`, `AMD Instinct MI300X` ->
    the catalogue's spelling (h100-80gb, h100, a100-80gb, mi300x) before aliases."""
    words = [w for w in re.split(r"[\s_\-]+", name.strip().lower()) if w and w not in _NOISE]
    joined: list[str] = []
    for w in words:
        # "80 GB" -> "80gb"
        if w in ("gb", "g") and joined and joined[-1].isdigit():
            joined[-1] += "gb"
        elif re.fullmatch(r"\d+g", w):
            joined.append(w + "b")
        else:
            joined.append(w)
    return "-".join(joined)


def lookup(name: str) -> Gpu:
    key = normalise(name)
    key = ALIASES.get(key, key)
    try:
        return CATALOG[key]
    except KeyError:
        valid = "; ".join(f"{g.name} ({g.marketing})" for g in CATALOG.values())
        raise ConfigError(
            f"--gpu {name!r} is not in the catalogue; known: {valid}. nvidia-smi's names work too "
            "(NVIDIA H100 80GB HBM3); for another GPU give --gpu-memory-gib"
        ) from None
