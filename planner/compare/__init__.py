"""`planner compare BASE NEW`: what changed between two runs and whether capacity moved beyond the noise.

    runs     read each results file (sweep.json or replay.json) and match points by configuration
    stats    the significance test on stored 95% intervals (MOVER, Holm)
    core     identity differences, capacity and statistic verdicts -> Comparison
    render   the one-screen summary and compare.md
    plots    overlay plots of both runs
"""

from __future__ import annotations

from pathlib import Path

from planner.compare.core import Comparison, compare
from planner.compare.render import markdown, summary_lines
from planner.compare.runs import load_run, match
from replay.atomic import atomic_text
from replay.results import write_json_atomic

JSON_FILE = "compare.json"
MARKDOWN_FILE = "compare.md"


def write_comparison(base: Path, new: Path, out_dir: Path, *, plots: bool = True, min_change: float = 0.0) -> Comparison:
    """Compare two results folders (or files) and write compare.json, compare.md and the plots
    into `out_dir`."""
    base_run, new_run = load_run(base), load_run(new)
    comparison = compare(base_run, new_run, min_change=min_change)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    if plots:
        from planner.compare.plots import capacity_plot, statistic_plots

        written = statistic_plots(comparison, match(base_run, new_run)[0], out_dir)
        if (capacity := capacity_plot(comparison, out_dir)) is not None:
            written.append(capacity)
    write_json_atomic(out_dir / JSON_FILE, comparison.model_dump(mode="json"))
    with atomic_text(out_dir / MARKDOWN_FILE) as f:
        f.write(markdown(comparison, written))
    return comparison


__all__ = ["JSON_FILE", "MARKDOWN_FILE", "Comparison", "compare", "summary_lines", "write_comparison"]
