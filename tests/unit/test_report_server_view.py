"""The report's server view: vLLM's figures per step beside the client's, and the time-split plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from matplotlib.image import imread

from planner.report import write_report
from replay.results import ReplayResults, ServerLatency

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "replay" / "replay.json"

pytestmark = pytest.mark.timeout(60)


def _latency(mean: float, p99: float, bucket: tuple[float, float | None]) -> ServerLatency:
    return ServerLatency(count=40, mean=mean, p50=mean, p99=p99, p50_bucket_ms=bucket, p99_bucket_ms=bucket)


def _with_server_view(tmp_path: Path) -> ReplayResults:
    """The fixture replay with vLLM figures: queueing grows past concurrency 8, decode stays flat."""
    results = ReplayResults.model_validate_json(FIXTURE.read_text())
    for s in results.steps:
        c = s.load.value
        queue = max(0.0, (c - 8) * 50.0)
        s.server = s.server.model_copy(update={
            "ttft_ms": _latency(queue + 20, queue + 39.8, (20.0, 40.0) if queue == 0 else (250.0, 500.0)),
            "queue_ms": _latency(queue, 297.0 if queue < 300 else 997.0, (0.0, 300.0) if queue < 300 else (800.0, None)),
            "prefill_ms": _latency(20.0, 40.0, (0.0, 300.0)),
            "decode_ms": _latency(200.0, 290.0, (0.0, 300.0)),
            "e2e_ms": _latency(queue + 220.0, 450.0, (300.0, 500.0)),
            "requests_finished": 40,
        })
        s.client = s.client.model_copy(update={
            "requests_finished": 41,
            "ttft_mean_minus_server_ms": 30.0 if c == 16 else 1.0,
            "client_or_network_latency": c == 16,
            "latency_note": "the client's mean TTFT (70.0 ms) is 30.0 ms above the server's" if c == 16 else None,
            "itl_bursts": 3 if c >= 16 else 0,
        })
    results.slo = {**results.slo, "server_queue_p99_ms": 1000.0}
    (tmp_path / "replay.json").write_text(json.dumps(results.model_dump(mode="json")))
    return results


def _rows(text: str, title: str) -> list[list[str]]:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]


def test_server_view_table_and_time_split_plot(tmp_path: Path) -> None:
    results = _with_server_view(tmp_path)
    names = {p.name for p in write_report(tmp_path)}
    assert "time-split.png" in names
    image = imread(tmp_path / "time-split.png")
    assert image.shape[0] > 200 and image.std() > 0.01
    report = (tmp_path / "report.md").read_text()
    rows = _rows(report, "Server view (vLLM's histograms)")
    assert len(rows) == len(results.steps)
    by_load = {r[0]: r for r in rows}
    # load 1: no queueing; the p99 carries its bucket.
    assert by_load["1"][1:4] == ["20", "39.8 (20-40)", "+1.0"]
    assert by_load["1"][6:12] == ["297 (0-300)", "0", "20", "200", "40 / 41", "0"]
    # load 32: 1,200 ms of queue, its p99 above the highest finite bucket.
    assert by_load["32"][6:8] == ["997 (>800)", "1,200"]
    assert by_load["16"][3] == "+30.0 (client side)"
    assert "- At concurrency (requests in flight) 16: the client's mean TTFT (70.0 ms)" in report
    with (tmp_path / "summary.csv").open(newline="") as f:
        csv_rows = {r["load_value"]: r for r in csv.DictReader(f)}
    assert csv_rows["32.0"]["server_queue_mean_ms"] == "1200.0" and csv_rows["32.0"]["server_queue_p99_ms"] == "997.0"
    assert csv_rows["16.0"]["client_or_network_latency"] == "True" and csv_rows["1.0"]["server_requests_finished"] == "40.0"
    slo_rows = report[report.index("## SLOs"):report.index("## Steps")]
    assert "| server_queue_p99_ms | 1000 | server |" in slo_rows and "| ttft_p99_ms | 800 | client |" in slo_rows


def test_results_without_server_figures_have_no_server_view(tmp_path: Path) -> None:
    (tmp_path / "replay.json").write_text(FIXTURE.read_text())
    names = {p.name for p in write_report(tmp_path)}
    assert "time-split.png" not in names
    assert "## Server view" not in (tmp_path / "report.md").read_text()
