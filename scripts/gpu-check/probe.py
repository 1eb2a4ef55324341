"""GPU paths of the planner against a real nvidia-smi and a real CUDA allocation (needs torch with CUDA).

    PYTHONPATH=. python scripts/gpu-check/probe.py
"""
import asyncio
import json
import subprocess
import sys

from planner import gpus, identity
from planner.estimate import gpu_catalog

out: dict = {}
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
out["nvidia_smi"] = smi.strip()
name, total_mib = [x.strip() for x in smi.splitlines()[0].split(",")]
found = gpus.discover("auto")
out["discover"] = [repr(g) for g in found]
out["hardware"] = identity.hardware().model_dump()
entry = gpu_catalog.lookup(name)
out["catalogue"] = {"name_given": name, "entry": entry.name, "total_gib": entry.total_gib}

import torch  # noqa: E402

free, total = torch.cuda.mem_get_info(0)
out["torch_total_gib"] = total / 2**30
out["nvidia_smi_total_gib"] = int(total_mib) / 1024
out["catalogue_minus_torch_gib"] = entry.total_gib - total / 2**30


async def sample() -> dict:
    sampler = gpus.GpuMemorySampler([found[0].index], interval_s=0.2)
    async with sampler:
        await asyncio.sleep(0.6)
        block = torch.empty(20 * 2**30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        await asyncio.sleep(1.5)
        del block
    return {"peak_mib": sampler.peak_mib, "samples": sampler.samples, "errors": sampler.errors, "note": sampler.note}


out["sampler_with_20_gib_allocated"] = asyncio.run(sample())
json.dump(out, sys.stdout, indent=2, default=str)
print()
