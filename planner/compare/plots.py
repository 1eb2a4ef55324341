"""Overlay plots of a comparison: each compared statistic against the load, both runs with their
95% intervals; and safe concurrency per point, before and after (with the knee intervals).
Object-API matplotlib on the Agg canvas, as planner.report.plots."""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure

from planner.compare.core import THROUGHPUT, Comparison, figure, representative_steps
from planner.compare.runs import RunPoint

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


def _curve(point: RunPoint, statistic: str) -> tuple[list[float], list[float], list[list[float | None] | None]]:
    """The point's figure at every concurrency it measured (one step per load, as compared)."""
    steps = sorted(
        (step for (mode, _), step in representative_steps(point.steps).items() if mode == "concurrency"),
        key=lambda step: step.load.value,
    )
    xs, ys, cis = [], [], []
    for step in steps:
        value, ci = figure(step, statistic, point.gpus)
        if value is not None:
            xs.append(step.load.value)
            ys.append(value)
            cis.append(ci)
    return xs, ys, cis


def statistic_plots(c: Comparison, pairs: list[tuple[RunPoint, RunPoint]], out_dir: Path) -> list[str]:
    """One plot per compared statistic: each matched point's curve in both runs, every
    concurrency each run measured, with its 95% interval; significant changes marked."""
    names = sorted({r.statistic for p in c.points for r in p.statistics})
    written = []
    for name in names:
        fig = Figure(figsize=(7.5, 4.5), layout="constrained")
        ax = fig.add_subplot()
        drawn = False
        for (base, new), compared in zip(pairs, c.points, strict=True):
            label = f" {base.label.split(' ', 1)[0]}" if len(pairs) > 1 else ""
            for point, color, marker, style, side in (
                (base, BASE_COLOR, "o", "--", "baseline"),
                (new, NEW_COLOR, "s", "-", "new"),
            ):
                xs, ys, cis = _curve(point, name)
                if not xs:
                    continue
                ax.errorbar(xs, ys, yerr=_errors(ys, cis), color=color, marker=marker, linestyle=style, capsize=3, label=f"{side}{label}")
                drawn = True
            for r in compared.statistics:
                if r.statistic == name and r.verdict in ("regressed", "improved") and r.new is not None:
                    ax.annotate(r.verdict, (r.value, r.new), textcoords="offset points", xytext=(4, 6), fontsize=8)
        if not drawn:
            continue
        unit = "output tokens/s per GPU" if name == THROUGHPUT else "ms"
        ax.set_title(f"{name}: baseline and new run (95% intervals; open sides not drawn)", fontsize=11)
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
            # The knee band from every step (its clean passes to the lowest load above every pass);
            # the knee interval (max passing to the lowest failure) for points without one.
            band = getattr(cap, f"{side}_knee_range")
            lo, hi = band if band else (top, (getattr(cap, f"{side}_knee_interval") or [None, None])[1])
            heights.append(value)
            if lo is not None and hi is not None:
                ax.errorbar(
                    [xs[len(heights) - 1] + offset], [(lo + hi) / 2], yerr=[(hi - lo) / 2],
                    color="#222222", capsize=8, linewidth=2,
                )  # fmt: skip
        ax.bar([x + offset for x in xs], heights, width=0.34, color=color, label="baseline" if side == "base" else "new run")
    ax.set_xticks(xs, [p.label.split(" ", 1)[0] for p in points], fontsize=9)
    ax.set_ylabel("safe concurrency (bar); knee band (whisker)", fontsize=9)
    ax.set_title("Safe concurrency per point, before and after", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    file = "compare-safe-concurrency.png"
    fig.savefig(out_dir / file, dpi=DPI)
    return file
