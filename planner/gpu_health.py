"""The point's GPUs during a step's window: clocks, throttling, temperature, power, and compute
processes that are not the server's.

The GPU memory sampler (planner.gpus.GpuMemorySampler) already runs nvidia-smi about once a
second around each step; `GpuHealthSampler` asks the same call for more fields and, at each
sample, for the compute processes on those GPUs. It is the step's GPU probe
(replay.step.environment.WindowProbe): the samples taken between the window's open and close
make the step's GPU record.

Throttling counts the reasons that slow a GPU down against its will: hardware slowdown, thermal
slowdown (software or hardware) and the power brake. The software power cap is kept apart: a GPU
at its power limit under full load is how it serves, so it disturbs a step only when asked
([replay] interference_power_cap). Idle, the applications-clock setting, sync boost and the
display clock are not interference.

A foreign process is a compute process on the point's GPUs whose pid is not in the server's tree.
In a container nvidia-smi may report the host's pids, which mean nothing here: such pids are not
called foreign, and the record says they could not be told apart.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.gpus import NVIDIA_SMI, Gpu, GpuMemorySampler
from replay.results import GpuEnvironment, GpuProcess, GpuState, StepEnvironment
from replay.step.environment import snapshot, tree

# nvidia-smi renamed clocks_throttle_reasons to clocks_event_reasons (driver 535); older drivers
# know only the first name, so the sampler falls back to it when the new one is refused.
HEALTH_FIELDS = "index,uuid,memory.used,clocks.sm,clocks.max.sm,{reasons}.active,temperature.gpu,power.draw"
REASON_NAMES = ("clocks_event_reasons", "clocks_throttle_reasons")
# As long as the memory sampler waits for nvidia-smi.
QUERY_TIMEOUT_S = 10.0
APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"

POWER_CAP = "sw_power_cap"
# nvmlClocksEventReasons bits that slow the GPU down against its will.
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


@dataclass(frozen=True)
class HealthSample:
    t_s: float
    index: str
    uuid: str | None
    memory_used_mib: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    # None: the driver did not say; else the throttle reasons active at the sample.
    throttle_reasons: tuple[str, ...] | None
    temperature_c: float | None
    power_draw_w: float | None


def _number(text: str) -> float | None:
    text = text.strip()
    if text.startswith("[") or text in ("", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def throttle_reasons(text: str) -> tuple[str, ...] | None:
    """The active reasons in a bitmask such as `0x0000000000000044`; None when not reported."""
    text = text.strip()
    try:
        mask = int(text, 16)
    except ValueError:
        return None
    return tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit)


def parse_health(text: str, t_s: float = 0.0) -> list[HealthSample]:
    """Rows of `nvidia-smi --query-gpu=<HEALTH_FIELDS> --format=csv,noheader,nounits`; rows that do
    not have the eight fields are skipped."""
    out: list[HealthSample] = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 8:
            continue
        index, uuid, used, sm, sm_max, reasons, temp, power = fields
        out.append(HealthSample(
            t_s=t_s, index=index, uuid=uuid if uuid.startswith(("GPU-", "MIG-")) else None,
            memory_used_mib=_number(used), sm_clock_mhz=_number(sm), sm_clock_max_mhz=_number(sm_max),
            throttle_reasons=throttle_reasons(reasons), temperature_c=_number(temp), power_draw_w=_number(power),
        ))
    return out


@dataclass(frozen=True)
class ComputeApp:
    gpu_uuid: str
    pid: int
    name: str
    used_mib: float | None


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """Rows of `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits` ("No running processes found" and odd rows are skipped)."""
    apps: list[ComputeApp] = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or not fields[1].isdigit():
            continue
        # A process name may hold a comma; the uuid, pid and memory columns never do.
        apps.append(ComputeApp(fields[0], int(fields[1]), ", ".join(fields[2:-1]), _number(fields[-1])))
    return apps


def gpu_states(samples: Sequence[HealthSample]) -> dict[str, GpuState]:
    """Each GPU's record over the samples taken inside a window."""
    by_gpu: dict[str, list[HealthSample]] = {}
    for s in samples:
        by_gpu.setdefault(s.index, []).append(s)
    out: dict[str, GpuState] = {}
    for index, rows in sorted(by_gpu.items()):
        clocks = [r.sm_clock_mhz for r in rows if r.sm_clock_mhz is not None]
        maxima = [r.sm_clock_max_mhz for r in rows if r.sm_clock_max_mhz is not None]
        judged = [r.throttle_reasons for r in rows if r.throttle_reasons is not None]
        temps = [r.temperature_c for r in rows if r.temperature_c is not None]
        power = [r.power_draw_w for r in rows if r.power_draw_w is not None]
        out[index] = GpuState(
            samples=len(rows),
            sm_clock_mhz_mean=round(sum(clocks) / len(clocks), 1) if clocks else None,
            sm_clock_mhz_min=min(clocks) if clocks else None,
            sm_clock_max_mhz=max(maxima) if maxima else None,
            throttled_share=round(sum(1 for r in judged if set(r) - {POWER_CAP}) / len(judged), 4) if judged else None,
            power_capped_share=round(sum(1 for r in judged if POWER_CAP in r) / len(judged), 4) if judged else None,
            throttle_reasons=sorted({name for r in judged for name in r}),
            temperature_c_max=max(temps) if temps else None,
            power_draw_w_max=max(power) if power else None,
        )
    return out


def foreign_processes(
    apps: Sequence[ComputeApp], uuid_to_index: dict[str, str], server: Collection[int], here: Collection[int]
) -> tuple[list[GpuProcess], list[int]]:
    """Compute processes on the point's GPUs that are not the server's, and the pids that are not
    processes of this machine's /proc (a container seeing the host's pids)."""
    foreign: list[GpuProcess] = []
    unknown: list[int] = []
    for app in apps:
        index = uuid_to_index.get(app.gpu_uuid)
        if index is None or app.pid in server:
            continue
        if app.pid not in here:
            unknown.append(app.pid)
            continue
        foreign.append(GpuProcess(gpu=index, pid=app.pid, name=app.name, used_mib=app.used_mib))
    return foreign, unknown


class GpuHealthSampler(GpuMemorySampler):
    """The memory sampler with clocks, throttling, temperature, power and compute processes, and
    the step's GPU probe. `server_pids`: the server's process ids (its tree counts as the server)."""

    def __init__(
        self,
        gpu_ids: Sequence[str],
        *,
        server_pids: Callable[[], Collection[int]],
        interval_s: float = 1.0,
        nvidia_smi: Sequence[str] = (NVIDIA_SMI,),
    ) -> None:
        super().__init__(gpu_ids, interval_s=interval_s, nvidia_smi=nvidia_smi)
        self.server_pids = server_pids
        self.health: list[HealthSample] = []
        self.apps: list[tuple[float, list[ComputeApp]]] = []
        self._reasons = REASON_NAMES[0]
        self._open_s: float | None = None
        self._close_s: float | None = None
        self.health_note: str | None = None

    def window_opened(self) -> None:
        self._open_s = time.perf_counter()

    def window_closed(self) -> None:
        self._close_s = time.perf_counter()

    async def _query(self, *args: str) -> tuple[int, str, str] | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._command, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            self.health_note = f"cannot run {self._command[0]}: {exc}"
            return None
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), QUERY_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            self.health_note = f"{self._command[0]} did not answer within {QUERY_TIMEOUT_S:g} s"
            return None
        return proc.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")

    async def sample_once(self) -> None:
        if not self.gpu_ids:
            return
        ids = ["-i", ",".join(self.gpu_ids), "--format=csv,noheader,nounits"]
        done = await self._query(f"--query-gpu={HEALTH_FIELDS.format(reasons=self._reasons)}", *ids)
        if done is not None and done[0] != 0 and self._reasons == REASON_NAMES[0]:
            # An older driver: it knows the throttle reasons by their old name.
            self._reasons = REASON_NAMES[1]
            done = await self._query(f"--query-gpu={HEALTH_FIELDS.format(reasons=self._reasons)}", *ids)
        if done is None or done[0] != 0:
            if done is not None:
                self.health_note = f"{self._command[0]} exited {done[0]}: {(done[2] or done[1]).strip()[:200]}"
            # The memory peak does not depend on the health fields: read it as before.
            await super().sample_once()
            return
        t_s = time.perf_counter()
        rows = parse_health(done[1], t_s)
        self.health.extend(rows)
        self._record("\n".join(f"{r.index}, {r.memory_used_mib if r.memory_used_mib is not None else '[N/A]'}" for r in rows))
        apps = await self._query(APPS_QUERY, "--format=csv,noheader,nounits")
        if apps is not None and apps[0] == 0:
            self.apps.append((t_s, parse_compute_apps(apps[1])))
        elif apps is not None:
            self.health_note = f"{self._command[0]} {APPS_QUERY} exited {apps[0]}"

    def environment(self) -> StepEnvironment:
        notes = [n for n in (self.note, self.health_note) if n]
        if self._open_s is None or self._close_s is None:
            return StepEnvironment(unreadable=notes + ["the window never opened and closed: GPU state not recorded"])
        lo, hi = self._open_s, self._close_s
        inside = [s for s in self.health if lo <= s.t_s <= hi]
        if not inside:
            # A window shorter than the interval: the samples nearest it stand in.
            inside = [s for s in self.health if s.t_s >= lo][: len(self.gpu_ids)] or self.health[-len(self.gpu_ids):]
        uuid_to_index = {s.uuid: s.index for s in self.health if s.uuid}
        here = snapshot().processes if Path("/proc").is_dir() else {}
        server = tree(here, set(self.server_pids())) if here else set(self.server_pids())
        foreign: dict[tuple[str, int], GpuProcess] = {}
        unknown: set[int] = set()
        for t_s, apps in self.apps:
            if not (lo <= t_s <= hi):
                continue
            found, missing = foreign_processes(apps, uuid_to_index, server, here.keys() if here else {os.getpid()})
            foreign |= {(p.gpu, p.pid): p for p in found}
            unknown |= set(missing)
        if unknown:
            notes.append(
                f"nvidia-smi reports process ids that are not this machine's ({', '.join(map(str, sorted(unknown)))}:"
                " a container?): foreign GPU processes cannot be told from the server's"
            )
        if not inside:
            notes.append("no GPU sample inside the window")
        return StepEnvironment(
            gpu=GpuEnvironment(gpus=gpu_states(inside), foreign_processes=list(foreign.values())), unreadable=notes
        )


def foreign_now(gpus: Sequence[Gpu], *, nvidia_smi: str = NVIDIA_SMI) -> list[str]:
    """Compute processes on these GPUs now (before any server of ours runs: all of them are
    foreign), as `name (pid N) on GPU i`; empty when nvidia-smi is absent or says nothing."""
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    if not by_uuid or shutil.which(nvidia_smi) is None:
        return []
    try:
        done = subprocess.run(
            [nvidia_smi, APPS_QUERY, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        return []
    if done.returncode != 0:
        return []
    return [f"{a.name} (pid {a.pid}) on GPU {by_uuid[a.gpu_uuid]}" for a in parse_compute_apps(done.stdout) if a.gpu_uuid in by_uuid]


def server_gpus(
    server_pids: Collection[int], gpus: Sequence[Gpu], *, nvidia_smi: Sequence[str] = (NVIDIA_SMI,)
) -> tuple[list[str], str | None]:
    """The GPUs of this machine that a running server computes on, for `planner replay` against a
    loopback URL (planner.quiet.locate_server found its processes): those where nvidia-smi lists
    a compute process of the server's tree. When none of them is listed (a container seeing the
    host's pids, or a server still starting), every GPU here is watched, and the note says so. No
    GPUs: nothing to watch, and the note says why."""
    if not gpus:
        return [], "no GPU on this machine (nvidia-smi lists none): GPUs not watched"
    try:
        done = subprocess.run(
            [*nvidia_smi, APPS_QUERY, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [g.index for g in gpus], f"nvidia-smi {APPS_QUERY} failed ({exc}): every GPU here is watched"
    if done.returncode != 0:
        return [g.index for g in gpus], f"nvidia-smi {APPS_QUERY} exited {done.returncode}: every GPU here is watched"
    here = snapshot().processes if Path("/proc").is_dir() else {}
    server = tree(here, set(server_pids)) if here else set(server_pids)
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    used = {by_uuid[a.gpu_uuid] for a in parse_compute_apps(done.stdout) if a.pid in server and a.gpu_uuid in by_uuid}
    if not used:
        return [g.index for g in gpus], "no compute process of the server's is listed by nvidia-smi: every GPU here is watched"
    return [g.index for g in gpus if g.index in used], None
