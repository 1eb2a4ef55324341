"""One PNG per searched point: the knee read from every step (replay.search.pass_fit).

Top: each measured load's pass fraction (passes / steps, the marker's size the number of steps),
the monotone fit of the pass probability with its Wilson 95% interval, the level the answer is
read at, the knee band shaded and the answer marked. Bottom: every SLO figure the search models
(replay.slo.rules.ratios: measured / bound) per step against load, with the interval its verdict
rests on where it has one (slo_ci95, replay.stats.across_steps), the bound at 1 and the
little-margin zone (pass_fit.LITTLE_MARGIN) shaded: a rule that stays in it has its verdicts
close to coin tosses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure

from planner.report.view import PointView
from replay.search import pass_fit
from replay.slo import rules as slo_mod

DPI = 110
FIT_COLOR = "#1f77b4"
ANSWER_COLOR = "#2ca02c"
BAND_COLOR = "#ff7f0e"


def pass_plot_name(point_id: str | None) -> str:
    """pass.png for a replay, pass-<point>.png for a sweep's point."""
    return "pass.png" if point_id is None else f"pass-{re.sub(r'[^A-Za-z0-9._-]+', '_', point_id)}.png"


def pass_plot(p: PointView, slo: Mapping[str, float], path: Path, title: str) -> Path | None:
    """None when the point has no closed-loop step to fit."""
    fitted = p.fit
    if not fitted.points:
        return None
    fig = Figure(figsize=(11.5, 7.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[1, 1.2])

    loads = [q.concurrency for q in fitted.points]
    lo, hi = fitted.knee_band
    if lo is not None and hi is not None and hi > lo:
        for ax in (top, bottom):
            ax.axvspan(lo, hi, color=BAND_COLOR, alpha=0.12, lw=0)
    top.scatter(
        loads, [q.passes / q.steps for q in fitted.points], s=[30 + 25 * q.steps for q in fitted.points],
        facecolors="none", edgecolors="#444444", zorder=4, label="pass fraction (size: steps)",
    )  # fmt: skip
    probability = [q.probability for q in fitted.points]
    top.step(loads, probability, where="mid", color=FIT_COLOR, lw=1.5, label="fitted pass probability")
    top.errorbar(
        loads, probability,
        yerr=[[max(0.0, q.probability - q.ci95[0]) for q in fitted.points],
              [max(0.0, q.ci95[1] - q.probability) for q in fitted.points]],
        fmt="none", ecolor=FIT_COLOR, elinewidth=1, capsize=3, alpha=0.7,
    )  # fmt: skip
    for q in fitted.points:
        top.annotate(f"{q.passes}/{q.steps}", (q.concurrency, q.passes / q.steps), fontsize=7,
                     xytext=(0, 7), textcoords="offset points", ha="center")  # fmt: skip
    top.axhline(fitted.level, color="#444444", ls=":", lw=1.2, label=f"level {fitted.level:g}")
    answer = p.answer_load if p.answer_basis == "start_majority" else fitted.knee_fit
    if answer is not None:
        for ax in (top, bottom):
            ax.axvline(answer, color=ANSWER_COLOR, ls="--", lw=1.5)
        if p.answer_basis == "start_majority" and p.start_knees:
            n = len(p.start_knees)
            label = f"answer read at {answer} (held on {pass_fit.majority_count(n)} of {n} server starts)"
        else:
            label = f"answer read at {answer}"
        top.plot([], [], color=ANSWER_COLOR, ls="--", label=label)
    if p.start_knees:
        # Each server start's own knee, so that a start that ran slower (or faster) shows.
        by_knee: dict[int, list[int]] = {}
        for start, knee in p.start_knees.items():
            if knee is not None:
                by_knee.setdefault(knee, []).append(start)
        top.scatter(list(by_knee), [1.11] * len(by_knee), marker="v", color="#7f7f7f", s=36, zorder=5,
                    label="each server start's own knee (s1, s2, ...)")  # fmt: skip
        for knee, starts in by_knee.items():
            top.annotate(", ".join(f"s{n}" for n in starts), (knee, 1.11), fontsize=7, xytext=(6, -3),
                         textcoords="offset points")  # fmt: skip
    if lo is not None and hi is not None and hi > lo:
        top.plot([], [], color=BAND_COLOR, alpha=0.3, lw=8, label=f"knee band {lo}-{hi}")
    top.set_ylim(-0.08, 1.17)
    top.set_ylabel("pass probability", fontsize=10)
    top.set_title(title, fontsize=12)
    top.grid(True, alpha=0.3)
    # Beside the axes, not on them: inside, a legend covered the steps near the answer.
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    _ratio_panel(bottom, p, slo)
    bottom.set_xlabel("concurrency (requests in flight)", fontsize=10)
    fig.savefig(path, dpi=DPI)
    return path


def _ratio_panel(ax, p: PointView, slo: Mapping[str, float]) -> None:
    cmap = colormaps["tab10"]
    steps = [s for s in p.steps if s.load.mode == "concurrency" and s.slo_verdict != "unresolved" and not s.disturbed]
    rules = sorted({rule for s in steps for rule in slo_mod.ratios(s, slo)})
    ax.axhspan(1 - pass_fit.LITTLE_MARGIN, 1 + pass_fit.LITTLE_MARGIN, color="#888888", alpha=0.12, lw=0,
               label=f"within {pass_fit.LITTLE_MARGIN:.0%} of the bound: little margin")  # fmt: skip
    ax.axhline(1.0, color="#444444", ls="--", lw=1, label="SLO bound")
    for i, rule in enumerate(rules):
        color = cmap(i % cmap.N)
        xs, ys, lows, highs = [], [], [], []
        for s in steps:
            ratio = slo_mod.ratios(s, slo).get(rule)
            if ratio is None:
                continue
            xs.append(s.load.value)
            ys.append(ratio)
            ci = s.slo_ci95.get(rule)
            bound = slo[rule]
            low = ci[0] / bound if ci and ci[0] is not None and bound > 0 else ratio
            high = ci[1] / bound if ci and ci[1] is not None and bound > 0 else ratio
            lows.append(max(0.0, ratio - low))
            highs.append(max(0.0, high - ratio))
        failed = [s.slo_verdict == "fail" for s in steps if slo_mod.ratios(s, slo).get(rule) is not None]
        ax.scatter([x for x, f in zip(xs, failed) if not f], [y for y, f in zip(ys, failed) if not f],
                   color=color, s=22, label=f"{rule} (measured / bound)")  # fmt: skip
        ax.scatter([x for x, f in zip(xs, failed) if f], [y for y, f in zip(ys, failed) if f],
                   color=color, marker="x", s=40)  # fmt: skip
        ax.errorbar(xs, ys, yerr=[lows, highs], fmt="none", ecolor=color, elinewidth=1, capsize=2, alpha=0.6)
    ax.scatter([], [], color="#444444", marker="x", s=40, label="a failed step")
    ax.set_ylabel("measured / SLO bound (95% interval)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
