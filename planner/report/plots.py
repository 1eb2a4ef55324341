"""PNG plots of a results file, drawn with matplotlib's object API on the Agg canvas.

No pyplot: a Figure made directly has no global state and never opens a window, so plots can be
drawn from any thread or process without choosing a backend first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Colormap
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from planner.report.law_plots import law_plot, law_plot_name
from planner.report.pass_plots import pass_plot, pass_plot_name
from planner.report.view import LOAD_AXIS_LABELS, PointView, ReportData
from replay.results import StepResult

DPI = 110
FAIL_COLOR = "#d62728"
SAFE_COLOR = "#2ca02c"
SLO_COLOR = "#444444"
INCONCLUSIVE_COLOR = "#ff7f0e"


def _file_stem(point_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", point_id)


def _new_figure(width_in: float, height_in: float) -> Figure:
    return Figure(figsize=(width_in, height_in), layout="constrained")


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def _style(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=12)
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.tick_params(labelsize=9)


def _load_axis(ax: Axes, values: Sequence[float], mode: str) -> None:
    """Concurrency probes double, so a log2 axis spaces them evenly; ticks stay plain numbers."""
    positive = [v for v in values if v > 0]
    if mode == "concurrency" and positive and max(positive) / min(positive) >= 8:
        ax.set_xscale("log", base=2)
        lo, hi = math.floor(math.log2(min(positive))), math.ceil(math.log2(max(positive)))
        ticks = [2**k for k in range(lo, hi + 1)]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    elif mode == "concurrency":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(x=0.04)


def _values(steps: Sequence[StepResult], get) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for s in steps:
        y = get(s)
        if y is not None:
            xs.append(s.load.value)
            ys.append(y)
    return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)


def _colors(points: Sequence[PointView]) -> dict[str, tuple]:
    cmap: Colormap = colormaps["tab10" if len(points) <= 10 else "tab20"]
    return {p.id: cmap(i % cmap.N) for i, p in enumerate(points)}


def _mark_safe(ax: Axes, p: PointView) -> None:
    if p.safe is not None and p.load_mode == "concurrency":
        ax.axvline(p.safe, color=SAFE_COLOR, linestyle="--", linewidth=1.5, label=f"safe concurrency ({p.safe})")


PANEL_TITLES = {
    "ttft": "Time to first token",
    "itl": "Inter-token latency",
    "tpot": "Time per output token",
    "e2e": "End-to-end latency",
}


def _latency_panel(ax: Axes, p: PointView, slo: dict[str, float], metric: str, stats: Sequence[str]) -> None:
    styles = {"p50": ("-", "o", 1.0), "p99": ("-", "s", 1.0), "p90": (":", "^", 0.8)}
    for stat in stats:
        xs, ys = _values(p.steps, lambda s, st=stat: getattr(getattr(s, f"{metric}_ms"), st))
        if not len(xs):
            continue
        line, marker, alpha = styles.get(stat, ("-", ".", 1.0))
        drawn = ax.plot(xs, ys, linestyle=line, marker=marker, markersize=5, alpha=alpha, label=f"{metric.upper()} {stat}")
        _error_bars(ax, p.steps, metric, stat, drawn[0].get_color())
        bound = slo.get(f"{metric}_{stat}_ms")
        if bound is not None:
            ax.axhline(bound, color=SLO_COLOR, linestyle=":", linewidth=1.5, label=f"SLO {stat} {bound:g} ms")
    # A failed step is marked on the curve of the SLO it broke; one that broke only other SLOs
    # (the other panel's, errors, preemptions) is marked in grey on the last curve.
    marks: dict[str, tuple[list, list]] = {kind: ([], []) for kind in ("broke", "other", "inconclusive", "unresolved")}
    for s in p.steps:
        if s.slo_pass:
            continue
        kind, y = _failed_mark(s, metric, stats)
        if y is not None:
            marks[kind][0].append(s.load.value)
            marks[kind][1].append(y)
    styles = {
        "broke": dict(marker="x", s=70, color=FAIL_COLOR, label=f"step broke {'an' if metric in ('itl', 'e2e') else 'a'} {metric.upper()} SLO"),
        "other": dict(marker="x", s=50, color="#888888", label="step broke another SLO"),
        "inconclusive": dict(marker="D", s=60, facecolors="none", edgecolors=INCONCLUSIVE_COLOR, linewidths=1.5,
                             label="step inconclusive (counted as a failure)"),
        "unresolved": dict(marker="o", s=60, facecolors="none", edgecolors="#888888", linewidths=1.5,
                           label="step unresolved (out of time; not a failure)"),
    }
    for kind, (xs, ys) in marks.items():
        if xs:
            ax.scatter(xs, ys, zorder=5, **styles[kind])
    _mark_safe(ax, p)
    _, all_y = _values(p.steps, lambda s: getattr(getattr(s, f"{metric}_ms"), stats[-1]))
    if len(all_y) and all_y.min() > 0 and all_y.max() / all_y.min() > 30:
        ax.set_yscale("log")
    _load_axis(ax, [s.load.value for s in p.steps], p.load_mode)
    _style(ax, PANEL_TITLES[metric], LOAD_AXIS_LABELS[p.load_mode], f"{metric.upper()} (ms)")
    ax.legend(fontsize=8, loc="upper left")


def _failed_mark(s: StepResult, metric: str, stats: Sequence[str]) -> tuple[str, float | None]:
    """How a failed step is marked on `metric`'s panel, and at which figure: inconclusive and
    unresolved steps on the last curve; one that broke this panel's SLO on the curve it broke;
    any other on the last curve, as "other"."""
    if s.slo_verdict in ("unresolved", "inconclusive"):
        return s.slo_verdict, getattr(getattr(s, f"{metric}_ms"), stats[-1])
    broken = [v for v in s.slo_violations if v.startswith(f"{metric}_") and v.split("_")[1] in stats]
    stat = broken[0].split("_")[1] if broken else stats[-1]
    return ("broke" if broken else "other"), getattr(getattr(s, f"{metric}_ms"), stat)


def _error_bars(ax: Axes, steps: Sequence[StepResult], metric: str, stat: str, color) -> None:
    """The 95% interval of each step's figure; a side with no finite bound is drawn as an arrow."""
    xs, ys, lows, highs, open_x, open_y = [], [], [], [], [], []
    for s in steps:
        summary = getattr(s, f"{metric}_ms")
        y = getattr(summary, stat)
        ci = (summary.ci95 or {}).get(stat)
        if y is None or ci is None:
            continue
        lo, hi = ci
        xs.append(s.load.value)
        ys.append(y)
        # Results written before intervals were widened to hold their estimate can have a bound
        # past it; matplotlib refuses a negative error.
        lows.append(max(0.0, y - lo) if lo is not None else 0.0)
        highs.append(max(0.0, hi - y) if hi is not None else 0.0)
        if hi is None:
            open_x.append(s.load.value)
            open_y.append(y)
    if xs:
        ax.errorbar(xs, ys, yerr=[lows, highs], fmt="none", ecolor=color, elinewidth=1, capsize=3, alpha=0.7)
    if open_x:
        ax.scatter(open_x, open_y, marker=r"$\uparrow$", s=120, color=color, zorder=4)


def _panel_stats(metric: str, slo: dict[str, float]) -> tuple[str, ...]:
    """p50 and p99, plus any other statistic an SLO bounds for this metric."""
    bounded = {k.split("_")[1] for k in slo if k.startswith(f"{metric}_") and k.endswith("_ms")}
    order = ("mean", "p50", "p90", "p95", "p99", "max")
    return tuple(st for st in order if st in bounded | {"p50", "p99"})


def latency_plot(p: PointView, slo: dict[str, float], path: Path, title: str) -> Path:
    # TTFT and ITL always; TPOT and end-to-end latency too when an SLO bounds them, so the SLO
    # that bound the answer is always on the page.
    metrics = ["ttft", "itl"] + [m for m in ("tpot", "e2e") if any(k.startswith(f"{m}_") for k in slo)]
    rows = 1 if len(metrics) <= 2 else 2
    cols = 2
    fig = _new_figure(12, 4.6 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    for ax, metric in zip(axes, metrics):
        _latency_panel(ax, p, slo, metric, _panel_stats(metric, slo))
    fig.suptitle(title, fontsize=13)
    return _save(fig, path)


def throughput_plot(points: Sequence[PointView], path: Path, colors: dict[str, tuple]) -> Path:
    fig = _new_figure(10, 5.2)
    ax = fig.subplots()
    per_gpu = all(p.gpus is not None for p in points)
    loads: list[float] = []
    for p in points:
        gpus = p.gpus or 1
        xs, ys = _values(p.steps, lambda s: s.output_tokens_per_s / gpus)
        if not len(xs):
            continue
        loads += list(xs)
        ax.plot(xs, ys, marker="o", markersize=4, color=colors[p.id], label=p.id)
        if p.safe is not None and p.load_mode == "concurrency":
            safe_y = float(np.interp(p.safe, np.r_[0.0, xs], np.r_[0.0, ys]))
            ax.scatter([p.safe], [safe_y], marker="*", s=160, color=colors[p.id], edgecolor="black", zorder=5)
    ax.scatter([], [], marker="*", s=160, color="white", edgecolor="black", label="safe concurrency")
    mode = points[0].load_mode if points else "concurrency"
    _load_axis(ax, loads, mode)
    unit = "per GPU" if per_gpu else "per server"
    _style(ax, f"Output throughput {unit}", LOAD_AXIS_LABELS[mode], f"Output tokens/s {unit}")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


def kv_plot(points: Sequence[PointView], slo: dict[str, float], path: Path, colors: dict[str, tuple]) -> Path:
    fig = _new_figure(12, 4.8)
    usage_ax, preempt_ax = fig.subplots(1, 2)
    loads: list[float] = []
    hit_rates = False
    for p in points:
        xs, ys = _values(p.steps, lambda s: None if s.server.kv_cache_usage_peak is None else s.server.kv_cache_usage_peak * 100)
        loads += list(xs)
        if len(xs):
            usage_ax.plot(xs, ys, marker="o", markersize=4, color=colors[p.id], label=p.id)
        # vLLM's prefix-cache hit rate over the same window: what the usage peak saved.
        xs, ys = _values(p.steps, lambda s: None if s.server.prefix_cache_hit_rate is None else s.server.prefix_cache_hit_rate * 100)
        if len(xs):
            usage_ax.plot(xs, ys, marker="x", markersize=5, linestyle="--", color=colors[p.id])
            hit_rates = True
        xs, ys = _values(p.steps, lambda s: s.server.preemptions)
        if len(xs):
            preempt_ax.plot(xs, ys, marker="o", markersize=4, color=colors[p.id], label=p.id)
    bound = slo.get("kv_cache_usage_max")
    if bound is not None:
        usage_ax.axhline(bound * 100, color=SLO_COLOR, linestyle=":", linewidth=1.5, label=f"SLO {bound * 100:g}%")
    mode = points[0].load_mode if points else "concurrency"
    for ax in (usage_ax, preempt_ax):
        _load_axis(ax, loads, mode)
    if hit_rates:
        usage_ax.plot([], [], marker="x", linestyle="--", color="grey", label="prefix-cache hit rate")
        _style(usage_ax, "KV-cache usage peak, prefix-cache hit rate (dashed)", LOAD_AXIS_LABELS[mode], "Percent")
    else:
        _style(usage_ax, "KV-cache usage peak", LOAD_AXIS_LABELS[mode], "KV-cache usage peak (%)")
    usage_ax.set_ylim(0, 105)
    _style(preempt_ax, "Preemptions during the step", LOAD_AXIS_LABELS[mode], "Preemptions (count)")
    _, all_preemptions = zip(*[_values(p.steps, lambda s: s.server.preemptions) for p in points]) if points else ((), ())
    top = max((float(v.max()) for v in all_preemptions if len(v)), default=0.0)
    # A flat line at zero is the good outcome; give it room instead of a 0-0.05 axis.
    preempt_ax.set_ylim(0, max(1.0, top * 1.1))
    preempt_ax.yaxis.get_major_locator().set_params(integer=True)
    if len(points) > 1:
        preempt_ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        if bound is not None:
            usage_ax.legend(handles=usage_ax.get_lines()[-1:], fontsize=8, loc="upper left")
    else:
        usage_ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def _failure_note(p: PointView) -> str:
    if p.failure is None:
        return p.status.replace("_", " ")
    note = p.failure.kind.replace("_", " ")
    if p.failure.estimated_max_model_len:
        note += f"\nfits {p.failure.estimated_max_model_len:,}"
    return note


def heatmap_plot(points: Sequence[PointView], path: Path, best_id: str | None = None) -> Path | None:
    """Safe concurrency per GPU over max-model-len x gpu-memory-utilization, one panel per TP size."""
    grid = [p for p in points if "max_model_len" in p.config and "gpu_memory_utilization" in p.config]
    if not grid:
        return None
    tps = sorted({int(p.config.get("tensor_parallel_size", 1)) for p in grid})
    lens = sorted({int(p.config["max_model_len"]) for p in grid})
    utils = sorted({float(p.config["gpu_memory_utilization"]) for p in grid})
    values = [p.safe_per_gpu for p in grid if p.safe_per_gpu is not None]
    vmax = max(values) if values else 1.0
    fig = _new_figure(max(5.0, 1.6 * len(lens) * len(tps) + 2.5), max(3.2, 0.9 * len(utils) + 2.2))
    axes = np.atleast_1d(fig.subplots(1, len(tps), sharey=True))
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    image = None
    for ax, tp in zip(axes, tps):
        cells = np.full((len(utils), len(lens)), np.nan)
        notes: dict[tuple[int, int], str] = {}
        counts: dict[tuple[int, int], int] = {}
        for p in grid:
            if int(p.config.get("tensor_parallel_size", 1)) != tp:
                continue
            r, c = utils.index(float(p.config["gpu_memory_utilization"])), lens.index(int(p.config["max_model_len"]))
            counts[(r, c)] = counts.get((r, c), 0) + 1
            if p.safe_per_gpu is not None:
                # Several points share a cell when the grid has extra axes; the best one is shown.
                cells[r, c] = p.safe_per_gpu if np.isnan(cells[r, c]) else max(cells[r, c], p.safe_per_gpu)
            elif (r, c) not in notes:
                notes[(r, c)] = _failure_note(p)
        best = next((p for p in grid if p.id == best_id and int(p.config.get("tensor_parallel_size", 1)) == tp), None)
        if best is not None:
            r = utils.index(float(best.config["gpu_memory_utilization"]))
            c = lens.index(int(best.config["max_model_len"]))
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=FAIL_COLOR, linewidth=3, zorder=4))
            ax.text(c, r + 0.42, "best", ha="center", va="top", fontsize=8, color=FAIL_COLOR, zorder=5)
        image = ax.imshow(np.ma.masked_invalid(cells), cmap=cmap, vmin=0, vmax=vmax, aspect="auto", origin="lower")
        for r in range(len(utils)):
            for c in range(len(lens)):
                if not np.isnan(cells[r, c]):
                    dark = cells[r, c] < 0.6 * vmax
                    label = f"{cells[r, c]:.1f}" + (f"\n(best of {counts[(r, c)]})" if counts.get((r, c), 0) > 1 else "")
                    ax.text(c, r, label, ha="center", va="center", fontsize=11, color="white" if dark else "black")
                else:
                    ax.text(c, r, notes.get((r, c), "not run"), ha="center", va="center", fontsize=9, color="#333333")
        ax.set_xticks(range(len(lens)), [f"{v:,}" for v in lens])
        ax.set_yticks(range(len(utils)), [f"{v:g}" for v in utils])
        ax.set_title(f"tensor-parallel size {tp}", fontsize=11)
        ax.set_xlabel("max-model-len (tokens)", fontsize=10)
    axes[0].set_ylabel("gpu-memory-utilization (fraction)", fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="Safe concurrency per GPU (requests)")
    fig.suptitle("Safe concurrency per GPU (grey: no safe point; red box: recommended)", fontsize=12)
    return _save(fig, path)


def kv_tokens_plot(points: Sequence[PointView], path: Path) -> Path | None:
    shown = [p for p in points if p.capacity.kv_cache_tokens is not None or p.kv_cache_tokens_predicted is not None]
    if not shown:
        return None
    has_prediction = any(p.kv_cache_tokens_predicted is not None for p in shown)
    fig = _new_figure(10, max(3.0, 0.45 * len(shown) + 1.6))
    ax = fig.subplots()
    y = np.arange(len(shown))
    height = 0.4 if has_prediction else 0.7
    reported = [p.capacity.kv_cache_tokens or 0 for p in shown]
    bars = ax.barh(y - (height / 2 if has_prediction else 0), reported, height, color="#1f77b4", label="reported by vLLM")
    ax.bar_label(bars, labels=[f"{v:,}" if v else "did not start" for v in reported], fontsize=8, padding=3)
    if has_prediction:
        predicted = [p.kv_cache_tokens_predicted or 0 for p in shown]
        bars = ax.barh(y + height / 2, predicted, height, color="#ff7f0e", alpha=0.8, label="predicted")
        ax.bar_label(bars, labels=[f"{v:,}" if v else "" for v in predicted], fontsize=8, padding=3)
    ax.set_yticks(y, [p.id for p in shown], fontsize=9)
    ax.invert_yaxis()
    _style(ax, "KV-cache capacity per server", "KV-cache capacity (tokens)", "")
    ax.set_xlim(0, max(reported + [p.kv_cache_tokens_predicted or 0 for p in shown]) * 1.18)
    ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:,.0f}")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


PHASE_COLORS = {"queue": "#d62728", "prefill": "#ff7f0e", "decode": "#1f77b4"}


def time_split_plot(p: PointView, path: Path, title: str) -> Path | None:
    """Where a request's time went, by vLLM's own histograms: queue, prefill, decode (means,
    stacked) against load, and each phase's share; None when no step has the three."""
    steps = [
        s for s in p.steps
        if all(getattr(s.server, f"{k}_ms") is not None and getattr(s.server, f"{k}_ms").mean is not None
               for k in PHASE_COLORS)
    ]
    if not steps:
        return None
    steps.sort(key=lambda s: s.load.value)
    xs = np.asarray([s.load.value for s in steps], dtype=float)
    phases = {k: np.asarray([getattr(s.server, f"{k}_ms").mean for s in steps]) for k in PHASE_COLORS}
    fig = _new_figure(12, 4.8)
    ax, share_ax = fig.subplots(1, 2)
    ax.stackplot(xs, *phases.values(), labels=[f"{k} (server mean)" for k in phases],
                 colors=list(PHASE_COLORS.values()), alpha=0.75)
    ex, ey = _values(steps, lambda s: s.server.e2e_ms.mean if s.server.e2e_ms is not None else None)
    if len(ex):
        ax.plot(ex, ey, color="black", linestyle="--", marker="o", markersize=4, label="e2e (server mean)")
    cx, cy = _values(steps, lambda s: s.e2e_ms.mean)
    if len(cx):
        ax.plot(cx, cy, color="#555555", linestyle=":", marker="s", markersize=4, label="e2e (client mean)")
    _mark_safe(ax, p)
    _load_axis(ax, list(xs), p.load_mode)
    _style(ax, "Where a request's time went", LOAD_AXIS_LABELS[p.load_mode], "time per request (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    total = sum(phases.values())
    total = np.where(total > 0, total, np.nan)
    for k, v in phases.items():
        share_ax.plot(xs, 100 * v / total, color=PHASE_COLORS[k], marker="o", markersize=4, label=k)
    _mark_safe(share_ax, p)
    _load_axis(share_ax, list(xs), p.load_mode)
    _style(share_ax, "Share of each phase", LOAD_AXIS_LABELS[p.load_mode], "share of queue + prefill + decode (%)")
    share_ax.set_ylim(0, 100)
    share_ax.legend(fontsize=8, loc="center left")
    fig.suptitle(title, fontsize=13)
    return _save(fig, path)


def point_plot_name(data: ReportData, p: PointView, kind: Literal["latency", "time-split"]) -> str:
    """A point's own plot file: latency.png for a replay, latency-<point>.png for a sweep's point."""
    return f"{kind}.png" if data.kind == "replay" else f"{kind}-{_file_stem(p.id)}.png"


def write_plots(data: ReportData, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    measured = [p for p in data.points if p.steps]
    colors = _colors(data.points)
    for p in measured:
        name = point_plot_name(data, p, "latency")
        title = f"{data.model or 'replay'}: latency against load" if data.kind == "replay" else f"{p.id}: latency against load"
        paths.append(latency_plot(p, data.slo, out_dir / name, title))
        fit_title = f"{data.model or 'replay'}: pass probability against load" if data.kind == "replay" else f"{p.id}: pass probability against load"
        if (fitted := pass_plot(p, data.slo, out_dir / pass_plot_name(None if data.kind == "replay" else p.id), fit_title)) is not None:
            paths.append(fitted)
        split_name = point_plot_name(data, p, "time-split")
        split_title = f"{data.model or 'replay'}: queue, prefill and decode against load" if data.kind == "replay" else f"{p.id}: queue, prefill and decode against load"
        split = time_split_plot(p, out_dir / split_name, split_title)
        if split is not None:
            paths.append(split)
    if measured:
        paths.append(throughput_plot(measured, out_dir / "throughput.png", colors))
        if any(s.server.kv_cache_usage_peak is not None or s.server.preemptions is not None for p in measured for s in p.steps):
            paths.append(kv_plot(measured, data.slo, out_dir / "kv-cache.png", colors))
    if data.kind == "sweep":
        for plot in (heatmap_plot(data.points, out_dir / "safe-concurrency-heatmap.png", data.best_id),
                     kv_tokens_plot(data.points, out_dir / "kv-tokens.png")):
            if plot is not None:
                paths.append(plot)
        # [sweep] strategy = "adaptive": each speed class's law (planner.report.law_plots).
        for info in data.speed_classes:
            if (plot := law_plot(info, data.predictions, out_dir / law_plot_name(info.id))) is not None:
                paths.append(plot)
    return paths
