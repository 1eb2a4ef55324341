"""Was a server's death the kernel's OOM killer? Both it and an operator's `kill -9` end a process
with SIGKILL (exit status -9, or 137 through a shell or a container runtime), and the server's log
says nothing either way. The kernel counts its kills in the memory cgroup (v2: memory.events,
v1: memory.oom_control, `oom_kill N`): a count that rose while the point ran names the OOM killer.

A server started by the planner lives in the planner's cgroup, so that is the one read. A server in
a container of its own is counted in the container's cgroup, which the planner does not see: its
death stays `server_died`, with the exit status and the hint.
"""

from __future__ import annotations

import signal
from pathlib import Path

from planner.capacity import Failure
from planner.launcher import VllmServer
from planner.vllm_log import log_tail

CGROUP_ROOT = Path("/sys/fs/cgroup")
SIGKILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)


def events_files(root: Path = CGROUP_ROOT, own: Path = Path("/proc/self/cgroup")) -> list[Path]:
    """The files that count this process's cgroup's OOM kills (those that exist)."""
    found = []
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.lstrip("/")
        if hierarchy == "0" and controllers == "":
            found += [root / path / "memory.events", root / "memory.events"]
        elif "memory" in controllers.split(","):
            found += [root / "memory" / path / "memory.oom_control", root / "memory" / "memory.oom_control"]
    return [f for f in dict.fromkeys(found) if f.is_file()]


def oom_kills() -> int | None:
    """The OOM kills counted in this process's cgroup so far (None when no counter can be read)."""
    counts = []
    for path in events_files():
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                counts.append(int(value))
                break
        if counts:
            return counts[0]
    return None


def death(server: VllmServer, kills_at_start: int | None) -> Failure:
    """The failure of a point whose server exited during the replay."""
    code = server.exit_code
    tail = log_tail(server.read_log())
    if code not in SIGKILLED:
        return Failure(
            kind="server_died", message=f"the server exited with code {code} during the replay", exit_code=code, log_tail=tail
        )
    now = oom_kills()
    where = ", ".join(str(p) for p in events_files()) or "no memory cgroup counter is readable here"
    if kills_at_start is not None and now is not None and now > kills_at_start:
        return Failure(
            kind="server_oom_killed",
            message=f"the kernel's OOM killer ended the server (SIGKILL, exit code {code}) during the replay: the"
            f" cgroup's oom_kill count rose from {kills_at_start} to {now} ({where})",
            exit_code=code,
            log_tail=tail,
        )
    if kills_at_start is None or now is None:
        why = f"the kernel's OOM killer or an operator ({where} to tell which)"
    else:
        why = f"by an operator or a supervisor; not by this cgroup's OOM killer, which counted no kill ({where})"
    return Failure(
        kind="server_died",
        message=f"the server exited with code {code} during the replay: killed by SIGKILL, {why}",
        exit_code=code,
        log_tail=tail,
    )
