"""Keeping the client and a CPU server apart: on a small machine the two fight over the same
cores, and the client's timing then measures the fight, not the server.

The last `client` CPUs this process may use go to the planner (os.sched_setaffinity); the rest go
to the server: its processes are pinned there and vLLM's CPU build binds its OpenMP threads to
them (VLLM_CPU_OMP_THREADS_BIND).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from planner.errors import ConfigError

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class CpuSplit:
    server: tuple[int, ...]
    client: tuple[int, ...]

    def bind_env(self) -> str:
        """The server's CPUs as vLLM's list syntax: `0-2,5`."""
        runs: list[str] = []
        ids = sorted(self.server)
        start = prev = ids[0]
        for cpu in ids[1:] + [None]:
            if cpu is not None and cpu == prev + 1:
                prev = cpu
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            if cpu is not None:
                start = prev = cpu
        return ",".join(runs)


def split(client: int, available: set[int] | None = None) -> CpuSplit | None:
    """None when `client` is 0 (no pinning)."""
    if client == 0:
        return None
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    if client >= len(cpus):
        raise ConfigError(
            f"[cpus] client = {client} leaves no CPU for the server: this process may use {len(cpus)}"
            f" ({', '.join(map(str, cpus))}); give the client fewer, or 0 to pin nothing"
        )
    return CpuSplit(server=tuple(cpus[:-client]), client=tuple(cpus[-client:]))


def pin_self(cpus: CpuSplit) -> None:
    """Pin this process's thread (and every thread and child it starts later) to the client CPUs."""
    os.sched_setaffinity(0, cpus.client)
