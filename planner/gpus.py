"""Which GPUs there are, which points run on which GPUs at once, and how full the GPUs got.

GPUs are read with `nvidia-smi --query-gpu=...` (NVML's Python bindings are not a dependency).
Indices are nvidia-smi's, which number GPUs by PCI bus; the launcher sets
CUDA_DEVICE_ORDER=PCI_BUS_ID beside CUDA_VISIBLE_DEVICES so that CUDA numbers them the same way.
No nvidia-smi under devices="auto" means CPU mode: no GPUs, points run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from planner.errors import ConfigError

NVIDIA_SMI = "nvidia-smi"
QUERY_FIELDS = "index,uuid,name,memory.total,memory.used"
_QUERY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Gpu:
    index: str
    name: str
    memory_total_mib: int
    memory_used_mib: int | None = None
    uuid: str | None = None


def _mib(text: str, *, where: str) -> int | None:
    text = text.strip()
    if text.startswith("[") or text in ("", "N/A"):  # "[N/A]", "[Not Supported]"
        return None
    try:
        return int(float(text))
    except ValueError:
        raise ConfigError(f"nvidia-smi output {where}: {text!r} is not a number of MiB") from None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits`.

    Rows without the uuid column (index,name,memory.total,memory.used) are read too.
    """
    gpus: list[Gpu] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        where = f"line {number}"
        if len(fields) < 4:
            raise ConfigError(
                f"nvidia-smi output {where}: {line!r} has {len(fields)} fields; expected {QUERY_FIELDS}"
            )
        index, rest = fields[0], fields[1:]
        uuid = rest.pop(0) if rest[0].startswith(("GPU-", "MIG-")) else None
        # A name may itself hold a comma; the two memory columns are always last.
        name = ", ".join(rest[:-2])
        total = _mib(rest[-2], where=where)
        if total is None:
            raise ConfigError(f"nvidia-smi output {where}: GPU {index} reports no memory.total")
        gpus.append(Gpu(index=index, name=name, memory_total_mib=total, memory_used_mib=_mib(rest[-1], where=where), uuid=uuid))
    return gpus


def _run_nvidia_smi(executable: str) -> str:
    try:
        done = subprocess.run(
            [executable, f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=_QUERY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"nvidia-smi did not answer within {_QUERY_TIMEOUT_S:g} s; use devices = \"none\" for CPU mode") from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(
            f"nvidia-smi failed (exit {done.returncode}): {reason[0] if reason else 'no output'}; "
            'fix the driver or use devices = "none" for CPU mode'
        )
    return done.stdout


def discover(devices: Literal["auto", "none"] | Sequence[str], *, nvidia_smi: str = NVIDIA_SMI) -> list[Gpu]:
    """The GPUs to use: all of them ("auto"), none ("none": CPU mode), or the listed indices/UUIDs."""
    if devices == "none":
        return []
    executable = shutil.which(nvidia_smi)
    if devices == "auto":
        return parse_nvidia_smi(_run_nvidia_smi(executable)) if executable else []
    if isinstance(devices, str):
        raise ConfigError(f'devices = {devices!r} is not valid: use "auto", "none" or a list of GPU indices')
    wanted = list(devices)
    if not wanted:
        return []
    if executable is None:
        raise ConfigError(f"devices = {wanted} names GPUs but there is no {nvidia_smi} on PATH; use \"none\" for CPU mode")
    found = parse_nvidia_smi(_run_nvidia_smi(executable))
    by_key = {g.index: g for g in found} | {g.uuid: g for g in found if g.uuid}
    unknown = [d for d in wanted if d not in by_key]
    if unknown:
        valid = ", ".join(g.index for g in found) or "(none)"
        raise ConfigError(f"devices: no GPU {', '.join(unknown)}; the GPUs here are {valid}")
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"devices = {wanted} lists a GPU twice")
    return [by_key[d] for d in wanted]


def cuda_visible_devices(gpu_ids: Sequence[str]) -> str:
    """The CUDA_VISIBLE_DEVICES value for a point placed on these GPUs ("" means no GPU at all)."""
    return ",".join(gpu_ids)


# -- placement ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    point: int  # index into the list of points given to plan_placement
    gpu_ids: tuple[str, ...]


def _take(free: list[str], in_use: set[str], need: int) -> tuple[str, ...] | None:
    """`need` GPUs from the free ones, preferring an aligned run of neighbours (0-3, 4-7, ...):
    GPUs that are neighbours by index usually share the faster links a tensor-parallel group uses."""
    available = [i for i, g in enumerate(free) if g not in in_use]
    if len(available) < need:
        return None
    available_set = set(available)
    runs = [range(start, start + need) for start in range(0, len(free) - need + 1)]
    aligned = [r for r in runs if r.start % need == 0]
    for candidates in (aligned, runs):
        for run in candidates:
            if all(i in available_set for i in run):
                return tuple(free[i] for i in run)
    return tuple(free[i] for i in available[:need])


def plan_placement(points_gpus_needed: Sequence[int], free: Sequence[str]) -> list[list[Placement]]:
    """Waves of points that run at the same time on disjoint GPU sets.

    Largest points first, each into the first wave with room (first-fit decreasing), so a
    tensor-parallel-8 point still gets a whole node instead of waiting behind scattered small
    ones; with power-of-two sizes this never needs more waves than the GPU-count bound. Within a
    wave, points keep their input order. With no GPUs (CPU mode) every point runs alone, in order.
    """
    if not free:
        return [[Placement(point=i, gpu_ids=())] for i in range(len(points_gpus_needed))]
    free_list = list(free)
    if len(set(free_list)) != len(free_list):
        raise ConfigError(f"the free GPUs {free_list} list a GPU twice")
    for i, need in enumerate(points_gpus_needed):
        if need < 1:
            raise ConfigError(f"point {i} needs {need} GPUs; a point on GPUs needs at least 1")
        if need > len(free_list):
            raise ConfigError(f"point {i} needs {need} GPUs but only {len(free_list)} are available ({', '.join(free_list)})")
    order = sorted(range(len(points_gpus_needed)), key=lambda i: -points_gpus_needed[i])
    waves: list[tuple[set[str], list[Placement]]] = []
    for i in order:
        need = points_gpus_needed[i]
        for in_use, placements in waves:
            taken = _take(free_list, in_use, need)
            if taken is not None:
                in_use.update(taken)
                placements.append(Placement(point=i, gpu_ids=taken))
                break
        else:
            taken = _take(free_list, set(), need)
            assert taken is not None  # need <= len(free_list), checked above
            waves.append((set(taken), [Placement(point=i, gpu_ids=taken)]))
    return [sorted(placements, key=lambda p: p.point) for _, placements in waves]


# -- memory sampling ---------------------------------------------------------------------------


class GpuMemorySampler:
    """Samples the used memory of some GPUs about once a second and keeps each one's peak.

        async with GpuMemorySampler(["0", "1"]) as sampler:
            ...  # run a step
        sampler.peak_mib   # {"0": 70123.0, "1": 70088.0}

    With no GPUs it samples nothing and `note` says so. A failed sample is counted in `errors`
    and the last reason kept in `note`; sampling goes on.
    """

    def __init__(self, gpu_ids: Sequence[str], *, interval_s: float = 1.0, nvidia_smi: Sequence[str] = (NVIDIA_SMI,)) -> None:
        self.gpu_ids = list(gpu_ids)
        self.interval_s = interval_s
        self._command = list(nvidia_smi)
        self.peak_mib: dict[str, float] = {}
        self.samples = 0
        self.errors = 0
        self.note: str | None = None if self.gpu_ids else "no GPUs: GPU memory not sampled"
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def __aenter__(self) -> GpuMemorySampler:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def start(self) -> None:
        if self.gpu_ids and self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        # Let a sample in flight finish (it is bounded by the query timeout): cancelling it would
        # lose a figure nvidia-smi already measured.
        self._stopping.set()
        await task
        # One last sample, so a step shorter than the interval still has a figure.
        await self.sample_once()

    async def sample_once(self) -> None:
        if not self.gpu_ids:
            return
        command = [*self._command, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", ",".join(self.gpu_ids)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            self.errors += 1
            self.note = f"cannot run {command[0]}: {exc}"
            return
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), _QUERY_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            self.errors += 1
            self.note = f"{command[0]} did not answer within {_QUERY_TIMEOUT_S:g} s"
            return
        if proc.returncode != 0:
            self.errors += 1
            self.note = f"{command[0]} exited {proc.returncode}: {stderr.decode(errors='replace').strip()[:200]}"
            return
        self._record(stdout.decode(errors="replace"))

    def _record(self, text: str) -> None:
        got = False
        for line in text.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != 2:
                continue
            try:
                used = float(fields[1])
            except ValueError:
                continue  # "[N/A]"
            index = fields[0]
            self.peak_mib[index] = max(used, self.peak_mib.get(index, used))
            got = True
        if got:
            self.samples += 1
        else:
            self.errors += 1
            self.note = f"no memory figures in nvidia-smi output: {text.strip()[:200]!r}"

    async def _run(self) -> None:
        # Scheduled by the clock, so slow nvidia-smi calls do not stretch the interval.
        next_at = time.perf_counter()
        while not self._stopping.is_set():
            await self.sample_once()
            next_at += self.interval_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), max(0.0, next_at - time.perf_counter()))
