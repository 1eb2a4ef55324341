"""The report's steps table shows vLLM's prefix-cache hit rate beside the KV usage peak."""

from __future__ import annotations

from pathlib import Path

import matplotlib.axes

from planner.report import plots
from planner.report.markdown import DASH, STEP_HEADER, step_rows
from planner.report.view import from_replay
from replay.results import ReplayResults, ServerSummary
from tests.fakes.results import make_step


def test_hit_rate_sits_beside_the_kv_peak():
    server = ServerSummary(metrics_available=True, kv_cache_usage_peak=0.5, prefix_cache_hit_rate=0.4821)
    (row,) = step_rows([make_step(server=server)])
    i = STEP_HEADER.index("prefix hits")
    assert STEP_HEADER[i - 1] == "KV peak"
    assert (row[i - 1], row[i]) == ("50.0%", "48.2%")
    # A server without the counters (older vLLM, not vLLM): a dash, not 0%.
    (row,) = step_rows([make_step()])
    assert row[i] == DASH


def test_kv_plot_draws_the_hit_rate_dashed_beside_the_usage(tmp_path, monkeypatch):
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "replay" / "replay.json"
    replay = ReplayResults.model_validate_json(fixture.read_text())
    for step in replay.steps:
        step.server.prefix_cache_hit_rate = 0.42
    data = from_replay(tmp_path, replay)
    drawn: list[tuple] = []
    plot = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append((args, kwargs))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    measured = [p for p in data.points if p.steps]
    plots.kv_plot(measured, data.slo, tmp_path / "kv.png", plots._colors(data.points))
    assert (tmp_path / "kv.png").read_bytes().startswith(b"\x89PNG")
    dashed = [args for args, kwargs in drawn if kwargs.get("linestyle") == "--" and len(args) == 2 and len(args[1])]
    assert len(dashed) == 1
    assert [round(float(y), 1) for y in dashed[0][1]] == [42.0] * len(replay.steps)
