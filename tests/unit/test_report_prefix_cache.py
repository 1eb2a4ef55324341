"""The report's steps table shows vLLM's prefix-cache hit rate beside the KV usage peak."""

from __future__ import annotations

from planner.report.markdown import DASH, STEP_HEADER, step_rows
from replay.results import ServerSummary
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
