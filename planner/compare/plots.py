"""Overlay plots of a comparison: each compared statistic against the load, both runs with their
95% intervals; and safe concurrency per point, before and after (with the knee intervals).
Object-API matplotlib on the Agg canvas, as planner.report.plots."""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure

from planner.compare.core import THROUGHPUT, Comparison

DPI = 110
BASE_COLOR = "#7f7f7f"
NEW_COLOR = "#1f77b4"


def _stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _errors(values: list[float], cis: list[list[float | None] | None]) -> list[list[float]]:
    lower, upper = [], []
    for v, ci in zip(values, cis, strict=True):
        lo, hi = (ci or [None, None])[:2]
        lower.append(0.0 if lo is None else max(0.0, v - lo))
        upper.append(0.0 if hi is None else max(0.0, hi - v))
    return [lower, upper]


def statistic_plots(c: Comparison, out_dir: Path) -> list[str]:
    names = sorted({r.statistic for p in c.points for r in p.statistics})
    written = []
    for name in names:
        fig = Figure(figsize=(7.5, 4.5), layout="constrained")
        ax = fig.add_subplot()
        drawn = False
        for index, point in enumerate(c.points):
            rows = [r for r in point.statistics if r.statistic == name and r.base is not None and r.new is not None]
            if not rows:
                continue
            x = [r.value for r in rows]
            shift = 0.02 * index
            label = point.label if len(c.points) > 1 else ""
            ax.errorbar(
                [v * (1 - 0.02 - shift) for v in x], [r.base for r in rows],
                yerr=_errors([r.base for r in rows], [r.base_ci95 for r in rows]),
                color=BASE_COLOR, marker="o", linestyle="--", capsize=3, label=f"baseline {label}".strip(),
            )  # fmt: skip
            ax.errorbar(
                [v * (1 + 0.02 + shift) for v in x], [r.new for r in rows],
                yerr=_errors([r.new for r in rows], [r.new_ci95 for r in rows]),
                color=NEW_COLOR, marker="s", linestyle="-", capsize=3, label=f"new {label}".strip(),
            )  # fmt: skip
            for r in rows:
                if r.verdict in ("regressed", "improved"):
                    ax.annotate(r.verdict, (r.value, r.new), textcoords="offset points", xytext=(4, 6), fontsize=8)
            drawn = True
        if not drawn:
            continue
        unit = "output tokens/s per GPU" if name == THROUGHPUT else "ms"
        ax.set_title(f"{name}: baseline and new run (95% intervals)", fontsize=11)
        ax.set_xlabel("concurrency", fontsize=10)
        ax.set_ylabel(unit, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        file = f"compare-{_stem(name)}.png"
        fig.savefig(out_dir / file, dpi=DPI)
        written.append(file)
    return written


def capacity_plot(c: Comparison, out_dir: Path) -> str | None:
    points = [p for p in c.points if p.capacity is not None]
    if not points:
        return None
    fig = Figure(figsize=(max(5.0, 1.2 * len(points) + 3), 4.5), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(points)))
    for offset, side, color in ((-0.18, "base", BASE_COLOR), (0.18, "new", NEW_COLOR)):
        heights = []
        for p in points:
            cap = p.capacity
            safe = getattr(cap, f"{side}_safe_concurrency")
            top = getattr(cap, f"{side}_max_passing_concurrency")
            value = safe if safe is not None else (top or 0)
            knee = getattr(cap, f"{side}_knee_interval") or [None, None]
            heights.append(value)
            if top is not None and knee[1] is not None:
                # The knee interval's top, drawn above the max passing concurrency.
                ax.vlines(x=[xs[len(heights) - 1] + offset], ymin=top, ymax=knee[1], color=color, linewidth=2)
        ax.bar([x + offset for x in xs], heights, width=0.34, color=color, label="baseline" if side == "base" else "new run")
    ax.set_xticks(xs, [p.label.split(" ", 1)[0] for p in points], fontsize=9)
    ax.set_ylabel("safe concurrency (line: max passing to lowest failing)", fontsize=9)
    ax.set_title("Safe concurrency per point, before and after", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    file = "compare-safe-concurrency.png"
    fig.savefig(out_dir / file, dpi=DPI)
    return file
