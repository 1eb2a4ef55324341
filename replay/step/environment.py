"""What else the machine did while a step measured: the environment of each window, and whether
it disturbed the measurement.

A latency figure measures the server only when nothing else competed with it. On a small machine
another process on the server's cores (a test suite, a second benchmark, a backup) slows every
token, and the search reads the slowdown as the server's knee. So each step records, between its
window's open and close:

- CPU (from /proc, Linux only): the load average; the CPU time the server's process tree, the
  planner's own tree, and every other process used; how much of that other time ran on the
  server's CPUs and on the planner's (a process counts for the CPU it last ran on, read at the
  window's close); the busiest other processes by name and pid; and steal time (a virtual
  machine's CPU taken by its host).
- GPU (from the caller's probes; the sweep plugs in nvidia-smi, planner.gpu_health): compute
  processes other than the server's on the point's GPUs, SM clock against its maximum, active
  throttle reasons, temperature and power draw.
- What could not be read on this machine, said in words.

A step is `disturbed` when its window saw more interference than the rules allow (`Interference`):
other processes took more than `cpu_share` of the server's CPU time (its CPUs x the window), a
foreign compute process ran on its GPUs, or its clocks were throttled for more than
`throttle_share` of the window. A disturbed step carries no information, like an unresolved one:
the search measures it again (replay.search.policy). `allow=True` records the environment and
flags nothing.

The step runner calls a `WindowProbe` at the window's open and close (replay.step.run); this
module knows nothing of nvidia-smi, which lives with the planner. The record's models
(`StepEnvironment` and its parts) are the results' schema, in replay.results.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from replay.results import CpuEnvironment, ProcessUse, StepEnvironment

PROC = Path("/proc")
# How many of the busiest other processes a step keeps.
BUSIEST = 3
# The longest a /proc reading may take before the step gives up on it.
READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Interference:
    """When a step counts as disturbed. `allow`: record, never flag (--allow-interference)."""

    cpu_share: float = 0.10
    foreign_gpu_process: bool = True
    throttle_share: float = 0.10
    # Count the software power cap as throttling too.
    power_cap: bool = False
    allow: bool = False


def disturbances(env: StepEnvironment, rules: Interference) -> list[str]:
    """What disturbed a step, one phrase per cause (empty: clean, or interference allowed)."""
    if rules.allow:
        return []
    out: list[str] = []
    cpu = env.cpu
    if cpu is not None and cpu.other_share_server_cpus is not None and cpu.other_share_server_cpus > rules.cpu_share:
        on_server = [p for p in cpu.busiest if "server" in p.on]
        names = ", ".join(f"{p.name} (pid {p.pid}, {p.cpu_s:.1f} s)" for p in on_server) or "several small processes"
        out.append(
            f"other processes used {cpu.other_share_server_cpus:.0%} of the server's CPUs"
            f" (more than {rules.cpu_share:.0%}): {names}"
        )
    gpu = env.gpu
    if gpu is not None:
        if rules.foreign_gpu_process and gpu.foreign_processes:
            names = ", ".join(f"{p.name} (pid {p.pid}) on GPU {p.gpu}" for p in gpu.foreign_processes)
            out.append(f"another compute process ran on the point's GPUs: {names}")
        for index, state in sorted(gpu.gpus.items()):
            share = state.throttled_share
            if rules.power_cap and state.power_capped_share is not None:
                share = max(share or 0.0, state.power_capped_share)
            if share is not None and share > rules.throttle_share:
                reasons = ", ".join(state.throttle_reasons) or "unnamed"
                out.append(
                    f"GPU {index} was throttled for {share:.0%} of the window"
                    f" (more than {rules.throttle_share:.0%}): {reasons}"
                )
    return out


@runtime_checkable
class WindowProbe(Protocol):
    """Told when a step's window opens and closes; then says what it saw in between."""

    def window_opened(self) -> None: ...

    def window_closed(self) -> None: ...

    def environment(self) -> StepEnvironment: ...


# -- /proc -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """One process from /proc/<pid>/stat: its name, parent, process group, session, CPU ticks and
    the CPU it last ran on."""

    pid: int
    name: str
    ppid: int
    pgrp: int
    ticks: int
    cpu: int | None
    session: int = 0


def parse_pid_stat(text: str) -> ProcStat:
    """`pid (comm) state ppid pgrp ... utime stime ... processor ...`: comm may hold spaces and
    parentheses, so the fields are split after its last ')'."""
    head, _, rest = text.rpartition(")")
    pid_text, _, name = head.partition(" (")
    fields = rest.split()
    # After comm: state(0) ppid(1) pgrp(2) session(3) ... utime(11) stime(12) ... processor(36).
    cpu = int(fields[36]) if len(fields) > 36 else None
    return ProcStat(
        int(pid_text), name, int(fields[1]), int(fields[2]), int(fields[11]) + int(fields[12]), cpu, int(fields[3])
    )


def parse_proc_stat(text: str) -> tuple[int, int] | None:
    """(all ticks, steal ticks) from /proc/stat's aggregate `cpu` line."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:]]
            # user nice system idle iowait irq softirq steal guest guest_nice: guest time is
            # already inside user and nice.
            total = sum(values[:8])
            return total, (values[7] if len(values) > 7 else 0)
    return None


def parse_cpu_busy(text: str) -> dict[int, int]:
    """Busy ticks (all but idle and iowait) of each CPU, from /proc/stat's `cpuN` lines."""
    busy: dict[int, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("cpu") and parts[0][3:].isdigit():
            values = [int(v) for v in parts[1:9]]
            busy[int(parts[0][3:])] = sum(values) - values[3] - (values[4] if len(values) > 4 else 0)
    return busy


def parse_loadavg(text: str) -> tuple[float, float]:
    parts = text.split()
    return float(parts[0]), float(parts[1])


@dataclass(frozen=True)
class Snapshot:
    t_s: float
    processes: dict[int, ProcStat]
    cpu_ticks: tuple[int, int] | None
    cpu_busy: dict[int, int] = field(default_factory=dict)


def snapshot(proc: Path = PROC) -> Snapshot:
    """Every process /proc lets us read (one that exits while we look is left out)."""
    processes: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = parse_pid_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        processes[stat.pid] = stat
    try:
        text = (proc / "stat").read_text()
        cpu_ticks, cpu_busy = parse_proc_stat(text), parse_cpu_busy(text)
    except OSError:
        cpu_ticks, cpu_busy = None, {}
    return Snapshot(time.perf_counter(), processes, cpu_ticks, cpu_busy)


def tree(processes: dict[int, ProcStat], roots: Collection[int]) -> set[int]:
    """The roots, their descendants, and the members of their process groups."""
    members = {pid for pid in roots if pid in processes}
    members |= {p.pid for p in processes.values() if p.pgrp in roots}
    children: dict[int, list[int]] = {}
    for p in processes.values():
        children.setdefault(p.ppid, []).append(p.pid)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in members:
                members.add(child)
                todo.append(child)
    return members


def all_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpus_of(pid: int) -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


class CpuProbe:
    """Reads /proc at the window's open and close.

    `server_pids`: the server's process ids (its tree and process group count as the server;
    None: not known, so other processes' time cannot be told from the server's). `remote`: the
    server runs on another machine, so only the planner's CPUs are watched. `server_cpus` and
    `planner_cpus`: the CPUs each may run on (None: read from the processes' affinity).
    """

    def __init__(
        self,
        server_pids: Callable[[], Collection[int]] | None = None,
        *,
        server_cpus: Sequence[int] | None = None,
        planner_cpus: Sequence[int] | None = None,
        proc: Path = PROC,
        remote: bool = False,
        background: bool = True,
    ) -> None:
        self.server_pids = server_pids
        self.remote = remote
        self.server_cpus = list(server_cpus) if server_cpus is not None else None
        self.planner_cpus = list(planner_cpus) if planner_cpus is not None else None
        self.proc = proc
        self.background = background
        self._open: Future[Snapshot] | None = None
        self._close: Future[Snapshot] | None = None
        self._loadavg: tuple[float, float] | None = None
        self.notes: list[str] = []

    def window_opened(self) -> None:
        if self.proc.is_dir():
            self._open = self._reading(lambda: snapshot(self.proc))

    def window_closed(self) -> None:
        if self._open is not None:
            self._close = self._reading(self._read_close)

    def _read_close(self) -> Snapshot:
        taken = snapshot(self.proc)
        try:
            self._loadavg = parse_loadavg((self.proc / "loadavg").read_text())
        except (OSError, ValueError, IndexError):
            self._loadavg = None
        return taken

    def _reading(self, read: Callable[[], Snapshot]) -> Future[Snapshot]:
        """Read /proc on a thread of its own: hundreds of small files take milliseconds that the
        step's event loop, at the very moment its window opens, must not lose. `background=False`
        reads at once (tests that change a made-up /proc between the reads)."""
        future: Future[Snapshot] = Future()

        def run() -> None:
            try:
                future.set_result(read())
            except BaseException as exc:  # handed to whoever asks for the result
                future.set_exception(exc)

        if self.background:
            threading.Thread(target=run, name="proc-reader", daemon=True).start()
        else:
            run()
        return future

    def environment(self) -> StepEnvironment:
        if not self.proc.is_dir():
            return StepEnvironment(unreadable=[f"no {self.proc}: CPU use by other processes not recorded (Linux only)"])
        if self._open is None or self._close is None:
            return StepEnvironment(unreadable=["the window never opened and closed: CPU use not recorded"])
        try:
            before, after = self._open.result(READ_TIMEOUT_S), self._close.result(READ_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            return StepEnvironment(unreadable=[f"{self.proc} could not be read: {exc}"])
        return StepEnvironment(cpu=self._cpu(before, after), unreadable=list(self.notes))

    def _cpu(self, before: Snapshot, after: Snapshot) -> CpuEnvironment:
        hz = os.sysconf("SC_CLK_TCK")
        window_s = max(after.t_s - before.t_s, 1e-9)
        roots = set(self.server_pids()) if self.server_pids is not None and not self.remote else None
        server = tree(after.processes, roots) | tree(before.processes, roots) if roots else set()
        # The planner's own processes: this one and its descendants in its session (its helpers),
        # less the server it launched. A child that started a session of its own is not the
        # planner's.
        me = after.processes.get(os.getpid())
        planner = {
            pid for pid in tree(after.processes, {os.getpid()})
            if me is None or after.processes[pid].session == me.session
        } - server
        server_cpus = self.server_cpus or next(
            (c for pid in sorted(roots or ()) if (c := cpus_of(pid)) is not None), all_cpus()
        )
        planner_cpus = self.planner_cpus or all_cpus()
        env = CpuEnvironment(server_cpus=server_cpus, planner_cpus=planner_cpus)
        if self._loadavg is not None:
            env.load_avg_1m, env.load_avg_5m = self._loadavg
        else:
            self.notes.append(f"{self.proc}/loadavg could not be read")
        if before.cpu_ticks and after.cpu_ticks:
            total = after.cpu_ticks[0] - before.cpu_ticks[0]
            env.steal_share = round((after.cpu_ticks[1] - before.cpu_ticks[1]) / total, 4) if total > 0 else 0.0
        else:
            self.notes.append(f"{self.proc}/stat could not be read: steal time not recorded")
        used = {pid: (p.ticks - (before.processes[pid].ticks if pid in before.processes else 0)) / hz
                for pid, p in after.processes.items()}
        env.planner_cpu_s = round(sum(used[p] for p in planner if p in used), 3)
        if roots is None and not self.remote:
            self.notes.append("the server's processes are not known here: other processes' CPU time not told apart")
            return env
        if roots is None:
            self.notes.append("the server runs on another machine: only the planner's CPUs were watched")
            server_cpus = []
        env.server_cpu_s = round(sum(used[p] for p in server if p in used), 3)
        others = [
            (pid, s) for pid, s in used.items() if s > 0 and pid not in server and pid not in planner
        ]
        on_server = [(pid, s) for pid, s in others if after.processes[pid].cpu in server_cpus]
        on_planner = [(pid, s) for pid, s in others if after.processes[pid].cpu in planner_cpus]
        if server_cpus:
            # A process counts for the CPU it last ran on, so one that moved between CPUs can be
            # counted in full on one: no more than those CPUs were busy, less the server's own.
            busy = _busy_s(before, after, server_cpus, hz)
            attributed = sum(s for _, s in on_server)
            if busy is not None:
                attributed = min(attributed, max(0.0, busy - env.server_cpu_s))
            env.other_cpu_s_server_cpus = round(attributed, 3)
            env.other_share_server_cpus = round(env.other_cpu_s_server_cpus / (window_s * len(server_cpus)), 4)
        else:
            env.server_cpus, env.server_cpu_s = [], None
        attributed = sum(s for _, s in on_planner)
        busy = _busy_s(before, after, planner_cpus, hz)
        if busy is not None:
            attributed = min(attributed, max(0.0, busy - env.planner_cpu_s))
        env.other_cpu_s_planner_cpus = round(attributed, 3)
        env.other_share_planner_cpus = round(env.other_cpu_s_planner_cpus / (window_s * len(planner_cpus)), 4)
        server_set, planner_set = {p for p, _ in on_server}, {p for p, _ in on_planner}
        env.busiest = [
            ProcessUse(
                pid=pid, name=after.processes[pid].name, cpu_s=round(s, 3),
                on=[n for n, members in (("server", server_set), ("planner", planner_set)) if pid in members],
            )
            for pid, s in sorted(others, key=lambda x: -x[1])[:BUSIEST]
        ]
        return env


def _busy_s(before: Snapshot, after: Snapshot, cpus: Sequence[int], hz: int) -> float | None:
    """Seconds these CPUs were busy between two snapshots; None when /proc/stat did not say."""
    if not all(c in before.cpu_busy and c in after.cpu_busy for c in cpus):
        return None
    return sum(after.cpu_busy[c] - before.cpu_busy[c] for c in cpus) / hz


def merge(parts: Iterable[StepEnvironment]) -> StepEnvironment:
    """One environment from the probes' parts (each fills what it reads)."""
    out = StepEnvironment()
    for part in parts:
        out.cpu = part.cpu or out.cpu
        out.gpu = part.gpu or out.gpu
        out.unreadable += [n for n in part.unreadable if n not in out.unreadable]
    return out


@dataclass
class EnvironmentWatch:
    """The probes a step calls at its window's open and close, and the rules that judge what they
    saw (replay.step.run's `watch`)."""

    probes: list[Any] = field(default_factory=list)
    rules: Interference = field(default_factory=Interference)

    def window_opened(self) -> None:
        for probe in self.probes:
            probe.window_opened()

    def window_closed(self) -> None:
        for probe in self.probes:
            probe.window_closed()

    def judge(self) -> tuple[StepEnvironment, list[str]]:
        env = merge(probe.environment() for probe in self.probes)
        return env, disturbances(env, self.rules)
