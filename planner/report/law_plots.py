"""One PNG per speed class of an adaptive sweep (planner.sweep.laws): each SLO rule's measured
ratio (measured / bound) against concurrency from the searched point's steps, its isotonic fit,
the bound at 1, and every prediction made from the law with its interval."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure

from planner.sweep.results import KneePrediction, SpeedClassInfo

DPI = 110
PREDICTION_COLOR = "#222222"
DISAGREED_COLOR = "#d62728"


def law_plot(info: SpeedClassInfo, predictions: Sequence[tuple[str, KneePrediction]], path: Path) -> Path | None:
    law = info.law
    if law is None or not law.fitted:
        return None
    fig = Figure(figsize=(8.0, 4.8), layout="constrained")
    ax = fig.add_subplot()
    cmap = colormaps["tab10"]
    for i, (rule, fitted) in enumerate(law.fitted.items()):
        color = cmap(i % cmap.N)
        measured = law.measured.get(rule, [])
        ax.scatter([c for c, _ in measured], [r for _, r in measured], color=color, s=22, label=f"{rule} measured")
        ax.plot([c for c, _ in fitted], [f for _, f in fitted], color=color, lw=1.5, label=f"{rule} fitted")
    ax.axhline(1.0, color="#444444", ls="--", lw=1, label="bound")
    mine = [(pid, k) for pid, k in predictions if k.speed_class == info.id]
    for j, (pid, k) in enumerate(mine):
        lo, hi = k.interval
        y = 1.0 - 0.04 * (j + 1)
        # Black diamonds, not a rule's colour: a prediction is no measurement (red: its
        # verification disagreed).
        color = PREDICTION_COLOR if k.verified is not False else DISAGREED_COLOR
        ax.plot([lo, hi if hi is not None else lo], [y, y], color=color, lw=2)
        ax.plot(
            [k.concurrency], [y], marker="D", color=color, ms=4, ls="none",
            label=None if j else "predicted knee (interval)",
        )
        ax.annotate(pid, (k.concurrency, y), fontsize=7, xytext=(4, -3), textcoords="offset points")
    ax.set_title(f"class {info.id} ({info.label}): law from {law.from_point}", fontsize=12)
    ax.set_xlabel("concurrency (requests in flight)", fontsize=10)
    ax.set_ylabel("measured / SLO bound", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=DPI)
    return path


def law_plot_name(class_id: str) -> str:
    return f"law-{re.sub(r'[^A-Za-z0-9._-]+', '_', class_id)}.png"
