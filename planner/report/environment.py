"""What the machine did beside the server, step by step, in words and in a table (see
replay.step.environment): the disturbed steps named with their cause, and each step's
environment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replay.results import StepResult

DASH = "-"


def _load(s: StepResult) -> str:
    value = s.load.value
    return f"{int(value)}" if s.load.mode == "concurrency" and value == int(value) else f"{value:g}"


def disturbed_lines(steps: Sequence[StepResult], disturbed_concurrency: Sequence[int], allowed: bool) -> list[str]:
    """One line per disturbed step and what disturbed it; the concurrencies that stayed disturbed
    after their retries; and, with interference allowed, that nothing was flagged."""
    lines = [f"disturbed at {_load(s)} (measured again, never used): {'; '.join(s.disturbed)}" for s in steps if s.disturbed]
    if disturbed_concurrency:
        lines.append(
            "still disturbed after the retries, so the search stopped there: "
            + ", ".join(map(str, disturbed_concurrency))
            + " (quiet the machine and run again)"
        )
    if allowed:
        lines.append("interference allowed (--allow-interference): steps were recorded but never called disturbed")
    return lines


def _percent(x: float | None) -> str:
    return DASH if x is None else f"{x * 100:.0f}%"


def cpu_cells(s: StepResult) -> tuple[str, str, str, str]:
    """Load average, other processes on the server's CPUs, steal, the busiest others."""
    cpu = s.environment.cpu if s.environment is not None else None
    if cpu is None:
        return DASH, DASH, DASH, DASH
    busiest = ", ".join(f"{p.name} ({p.pid}, {p.cpu_s:.1f} s)" for p in cpu.busiest) or DASH
    load = DASH if cpu.load_avg_1m is None else f"{cpu.load_avg_1m:.2f}"
    return load, _percent(cpu.other_share_server_cpus), _percent(cpu.steal_share), busiest


def gpu_cell(s: StepResult) -> str:
    gpu = s.environment.gpu if s.environment is not None else None
    if gpu is None:
        return DASH
    parts = []
    for index, g in sorted(gpu.gpus.items()):
        clock = (
            f"SM {g.sm_clock_mhz_mean:.0f}/{g.sm_clock_max_mhz:.0f} MHz"
            if g.sm_clock_mhz_mean is not None and g.sm_clock_max_mhz is not None
            else "SM clock ?"
        )
        throttled = f", throttled {_percent(g.throttled_share)} ({', '.join(g.throttle_reasons)})" if g.throttled_share else ""
        temp = f", {g.temperature_c_max:.0f} C" if g.temperature_c_max is not None else ""
        power = f", {g.power_draw_w_max:.0f} W" if g.power_draw_w_max is not None else ""
        parts.append(f"GPU {index}: {clock}{throttled}{temp}{power}")
    parts += [f"foreign: {p.name} (pid {p.pid}) on GPU {p.gpu}" for p in gpu.foreign_processes]
    return "; ".join(parts) or DASH


def section(points: Sequence[tuple[str, Sequence[StepResult]]], table) -> list[str]:
    """`## Environment`: every step that recorded one. `table` is markdown.table."""
    rows = []
    unreadable: dict[str, None] = {}
    for pid, steps in points:
        for s in steps:
            if s.environment is None:
                continue
            load, others, steal, busiest = cpu_cells(s)
            rows.append((
                pid, _load(s), "disturbed: " + "; ".join(s.disturbed) if s.disturbed else "clean",
                load, others, steal, busiest, gpu_cell(s),
            ))
            unreadable.update(dict.fromkeys(s.environment.unreadable))
    if not rows:
        return []
    out = [
        "## Environment",
        "",
        "What else ran during each step's window (docs/concepts/environment.md). A disturbed step carries no"
        " information: it is measured again and never used for the answer.",
        "",
    ] + table(["point", "load", "step", "load avg", "others on server CPUs", "steal", "busiest others", "GPUs"], rows)
    if unreadable:
        out += ["Not readable on this machine:", ""] + [f"- {note}" for note in unreadable] + [""]
    return out


def csv_fields(s: StepResult) -> dict[str, Any]:
    env = s.environment
    cpu = env.cpu if env is not None else None
    gpu = env.gpu if env is not None else None
    throttled = [g.throttled_share for g in (gpu.gpus.values() if gpu else []) if g.throttled_share is not None]
    return {
        "disturbed": "; ".join(s.disturbed) or None,
        "load_avg_1m": cpu.load_avg_1m if cpu else None,
        "other_share_server_cpus": cpu.other_share_server_cpus if cpu else None,
        "other_share_planner_cpus": cpu.other_share_planner_cpus if cpu else None,
        "steal_share": cpu.steal_share if cpu else None,
        "busiest_other": (f"{cpu.busiest[0].name} ({cpu.busiest[0].pid})" if cpu and cpu.busiest else None),
        "gpu_throttled_share_max": max(throttled) if throttled else None,
        "gpu_foreign_processes": len(gpu.foreign_processes) if gpu else None,
    }


CSV_COLUMNS = (
    "disturbed", "load_avg_1m", "other_share_server_cpus", "other_share_planner_cpus", "steal_share", "busiest_other",
    "gpu_throttled_share_max", "gpu_foreign_processes",
)
