"""A look at the machine before the load: is anything else running where the server and the
planner will run?

`planner sweep` and `planner replay` watch the CPUs for a second before they start (the same
/proc reading each step's window makes, replay.step.environment), and the GPUs that will serve for
compute processes. A busy machine gets one line naming the busiest processes; with
`--require-quiet` that line is an error instead.

`planner replay` measures a server it did not start. Against a loopback URL the server's process
is found from its listening port (/proc/net/tcp and tcp6 give the socket's inode; the process
holding that inode among its open files is the server). Against any other host the server's
machine cannot be seen from here: only the planner's CPUs are watched, and the line says so.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from planner.errors import ConfigError
from replay.results import CpuEnvironment
from replay.step.environment import PROC, CpuProbe

# How long the check watches the CPUs.
CHECK_S = 1.0
# Other processes above this share of the CPUs that will serve make the machine busy.
BUSY_SHARE = 0.10
_LISTEN = "0A"


class NotQuiet(ConfigError):
    """--require-quiet, and the machine was busy: other processes used more than 10% of the CPUs
    that will serve, or a compute process was on the GPUs that will.

    What to do: stop the processes the message names (or wait for them), or run without
    --require-quiet; the steps they disturb are then measured again and named in the results."""


@dataclass(frozen=True)
class ServerLocation:
    """Where a replay's server runs, as far as this machine can tell."""

    pids: tuple[int, ...] = ()
    remote: bool = False
    # Why the server's process is not known, when it is not.
    note: str | None = None


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listening_inodes(port: int, proc: Path = PROC) -> set[int]:
    """Socket inodes listening on `port` (any address), from /proc/net/tcp and tcp6."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                inodes.add(int(fields[9]))
    return inodes


def socket_owners(inodes: Collection[int], proc: Path = PROC) -> set[int]:
    """The processes holding any of these socket inodes open (those whose fds we may read)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    owners: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    owners.add(int(entry.name))
                    break
        except OSError:
            continue  # another user's process, or one that exited
    return owners


def locate_server(url: str, proc: Path = PROC) -> ServerLocation:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not is_loopback(host):
        return ServerLocation(remote=True, note=f"the server at {host} is not on this machine: its CPUs and GPUs cannot be seen from here")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not proc.is_dir():
        return ServerLocation(note=f"no {proc}: the server's process cannot be found from port {port}")
    inodes = listening_inodes(port, proc)
    if not inodes:
        return ServerLocation(note=f"nothing listens on port {port} in {proc}/net/tcp: the server's process is not known")
    owners = socket_owners(inodes, proc)
    if not owners:
        return ServerLocation(note=f"the process listening on port {port} is another user's: the server's process is not known")
    return ServerLocation(pids=tuple(sorted(owners)))


@dataclass(frozen=True)
class Check:
    busy: bool
    line: str
    cpu: CpuEnvironment | None


def check_machine(
    server_pids: Collection[int] | None,
    *,
    remote: bool = False,
    server_cpus: Sequence[int] | None = None,
    planner_cpus: Sequence[int] | None = None,
    foreign_gpu: Sequence[str] = (),
    watch_s: float = CHECK_S,
    busy_share: float = BUSY_SHARE,
    proc: Path = PROC,
) -> Check:
    """Watch the CPUs for `watch_s`; `foreign_gpu` names compute processes already on the GPUs
    that will serve. Busy: other processes used more than `busy_share` of the CPUs that will serve
    (the server's, else the planner's), or a GPU has a foreign process."""
    pids = set(server_pids) if server_pids is not None else None
    probe = CpuProbe((lambda: pids) if pids is not None else None, server_cpus=server_cpus,
                     planner_cpus=planner_cpus, proc=proc, remote=remote)
    probe.window_opened()
    time.sleep(watch_s)
    probe.window_closed()
    env = probe.environment()
    cpu = env.cpu
    if cpu is None:
        return Check(False, "machine check: " + "; ".join(env.unreadable), None)
    shares = [(s, where) for s, where in ((cpu.other_share_server_cpus, "the server's CPUs"),
                                          (cpu.other_share_planner_cpus, "the planner's CPUs")) if s is not None]
    share, where = max(shares, default=(None, ""))
    busy = (share is not None and share > busy_share) or bool(foreign_gpu)
    load = f"load average {cpu.load_avg_1m:.2f}" if cpu.load_avg_1m is not None else "load average unknown"
    names = ", ".join(f"{p.name} (pid {p.pid}, {p.cpu_s / watch_s:.0%} of a CPU)" for p in cpu.busiest) or "none"
    if busy:
        parts = [f"the machine is busy: {load}"]
        if share is not None:
            parts.append(f"other processes used {share:.0%} of {where} over {watch_s:g} s")
        if foreign_gpu:
            parts.append("on the GPUs that will serve: " + ", ".join(foreign_gpu))
        line = "; ".join(parts) + f"; busiest: {names}"
    else:
        line = f"the machine is quiet: {load}" + (f", other processes used {share:.0%} of {where}" if share is not None else "")
    if env.unreadable:
        line += " (" + "; ".join(env.unreadable) + ")"
    return Check(busy, line, cpu)


def enforce(check: Check, require_quiet: bool) -> str:
    """The line to print; an error instead when the machine is busy and quiet was required."""
    if check.busy and require_quiet:
        raise NotQuiet(f"--require-quiet: {check.line}; stop those processes, or drop --require-quiet")
    return check.line
