"""`planner report`: rebuild report.md, report.html, summary.csv and the plots from sweep.json or replay.json alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from planner.cost import prices, saved_gpu_hour
from planner.errors import ReportError
from planner.report import html, markdown, plots, ranking, summary_csv
from planner.report.fleet import check_targets, plan_fleet
from planner.report.load import load_results
from planner.report.view import build
from planner.sweep.results import SweepResults

REPORT_FILE = "report.md"
CSV_FILE = "summary.csv"


def write_report(
    results_dir: Path,
    *,
    target_rps: float | None = None,
    target_concurrency: int | None = None,
    gpu_hour_price: Sequence[str] = (),
) -> list[Path]:
    """Write report.md, summary.csv, report.html and the PNG plots next to the results; return their paths."""
    check_targets(target_rps, target_concurrency)
    source, results = load_results(Path(results_dir))
    out_dir = source.parent
    saved = saved_gpu_hour(results.settings.model_extra) if isinstance(results, SweepResults) else {}
    data = dataclasses.replace(build(source, results), prices=prices(gpu_hour_price, saved, f"{source} settings.cost.gpu_hour"))
    plan = None
    if target_rps is not None or target_concurrency is not None:
        plan = plan_fleet(data.points, target_rps=target_rps, target_concurrency=target_concurrency)
    plot_paths = plots.write_plots(data, out_dir)
    report = out_dir / REPORT_FILE
    report.write_text(markdown.render(data, plan, [p.name for p in plot_paths]), encoding="utf-8")
    csv_path = out_dir / CSV_FILE
    csv_path.write_text(summary_csv.render(data), encoding="utf-8")
    page = out_dir / html.HTML_FILE
    page.write_text(html.render(data, plan, {p.name: p.read_bytes() for p in plot_paths}), encoding="utf-8")
    return [report, csv_path, page, *plot_paths]


def rank_sweeps(
    results_dirs: Sequence[Path],
    *,
    target_rps: float | None = None,
    target_concurrency: int | None = None,
    gpu_hour_price: Sequence[str] = (),
) -> str:
    """The cheapest measured configuration for the target across several sweeps, as markdown."""
    check_targets(target_rps, target_concurrency)
    if target_rps is None and target_concurrency is None:
        raise ReportError("comparing several results folders needs a target: --target-rps or --target-concurrency")
    sweeps = []
    for folder in results_dirs:
        source, results = load_results(Path(folder))
        saved = saved_gpu_hour(results.settings.model_extra) if isinstance(results, SweepResults) else {}
        sweeps.append((build(source, results), prices(gpu_hour_price, saved, f"{source} settings.cost.gpu_hour")))
    return ranking.render(
        ranking.rank(sweeps, target_rps=target_rps, target_concurrency=target_concurrency)
    )


__all__ = ["rank_sweeps", "write_report"]
