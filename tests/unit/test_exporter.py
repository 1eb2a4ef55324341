"""PlannerMetrics: its own registry, the observer calls, and serving over loopback HTTP."""

from __future__ import annotations

import socket

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from planner.errors import ConfigError
from planner.exporter import PlannerMetrics
from replay.results import LoadSpec
from tests.fakes.results import finished_step, record, value


def test_observer_calls_update_the_series() -> None:
    m = PlannerMetrics()
    m.step_started(LoadSpec(mode="concurrency", value=4))
    for _ in range(3):
        m.request_sent()
    assert value(m, "planner_inflight_requests", point="replay") == 3
    m.request_finished(record(ttft_s=0.2), measured=True)
    m.request_finished(record(), measured=False)
    m.request_finished(record(error="http_503"), measured=True)
    assert value(m, "planner_inflight_requests", point="replay") == 0
    assert value(m, "planner_target_concurrency", point="replay") == 4
    assert value(m, "planner_requests_total", point="replay", status="ok") == 2
    assert value(m, "planner_requests_total", point="replay", status="http_503") == 1
    # Warm-up and failed requests stay out of the latency histograms.
    assert value(m, "planner_ttft_seconds_count", point="replay") == 1
    assert value(m, "planner_ttft_seconds_sum", point="replay") == pytest.approx(0.2)
    assert value(m, "planner_itl_seconds_count", point="replay") == 2
    assert value(m, "planner_itl_seconds_sum", point="replay") == pytest.approx(0.05)
    assert value(m, "planner_e2e_seconds_count", point="replay") == 1
    m.step_finished(finished_step(passed=False))
    assert value(m, "planner_step_slo_pass", point="replay") == 0
    assert value(m, "planner_step_output_tokens_per_s", point="replay") == 321.0
    assert value(m, "planner_steps_total", point="replay", slo_pass="false") == 1


def test_bursts_are_counted_apart_and_tpot_is_observed() -> None:
    m = PlannerMetrics()
    m.step_started(LoadSpec(mode="concurrency", value=1))
    m.request_sent()
    # Five chunks: the 2nd and 3rd read together with the 1st (zero gaps), then two 20 ms gaps.
    m.request_finished(record(ttft_s=0.1, gaps_s=(0.0, 0.0, 0.02, 0.02)), measured=True)
    assert value(m, "planner_itl_burst_gaps_total", point="replay") == 2
    assert value(m, "planner_itl_seconds_count", point="replay") == 2
    # (end - first token) / (5 - 1) = (0.04 + 0.001) / 4.
    assert value(m, "planner_tpot_seconds_count", point="replay") == 1
    assert value(m, "planner_tpot_seconds_sum", point="replay") == pytest.approx(0.041 / 4)


def test_burst_counter_exists_at_zero_once_a_request_is_measured() -> None:
    # The dashboard's bursts panel shows 0, not "No data", on a server whose chunks never bunch up.
    m = PlannerMetrics()
    m.step_started(LoadSpec(mode="concurrency", value=1))
    assert value(m, "planner_itl_burst_gaps_total", point="replay") is None
    m.request_sent()
    m.request_finished(record(ttft_s=0.1, gaps_s=(0.02, 0.02)), measured=True)
    assert value(m, "planner_itl_burst_gaps_total", point="replay") == 0


def test_buckets_reach_from_milliseconds_to_minutes() -> None:
    m = PlannerMetrics()
    m.request_sent()
    m.request_finished(record(ttft_s=0.004, gaps_s=(0.0015,)), measured=True)
    assert value(m, "planner_ttft_seconds_bucket", point="replay", le="0.005") == 1
    assert value(m, "planner_itl_seconds_bucket", point="replay", le="0.001") == 0
    assert value(m, "planner_itl_seconds_bucket", point="replay", le="0.0025") == 1
    assert value(m, "planner_e2e_seconds_bucket", point="replay", le="300.0") == 1


def test_sweep_points_label_every_series() -> None:
    m = PlannerMetrics()
    config = {"max_model_len": 4096, "gpu_memory_utilization": 0.9, "tensor_parallel_size": 2, "dtype": "bf16"}
    m.point_started("p1", config, "tiny")
    assert value(m, "planner_point_info", point="p1", model="tiny", max_model_len="4096",
                 gpu_memory_utilization="0.9", tensor_parallel_size="2") == 1
    m.step_started(LoadSpec(mode="rate", value=2.5))
    m.request_sent()
    m.request_finished(record(), measured=True)
    assert value(m, "planner_target_rate_rps", point="p1") == 2.5
    assert value(m, "planner_requests_total", point="p1", status="ok") == 1
    assert value(m, "planner_requests_total", point="replay", status="ok") is None
    m.point_finished("p1", 10.5, (13.0, 14.5))
    assert value(m, "planner_safe_concurrency_per_gpu", point="p1") == 10.5
    assert value(m, "planner_knee_band_per_gpu", point="p1", edge="low") == 13.0
    assert value(m, "planner_knee_band_per_gpu", point="p1", edge="high") == 14.5
    assert value(m, "planner_target_rate_rps", point="p1") is None
    m.point_started("p2", {}, "tiny")
    m.point_finished("p2", None, (None, 3.0))
    assert value(m, "planner_safe_concurrency_per_gpu", point="p2") is None
    # An edge the steps did not give has no series, rather than a 0.
    assert value(m, "planner_knee_band_per_gpu", point="p2", edge="low") is None
    assert value(m, "planner_knee_band_per_gpu", point="p2", edge="high") == 3.0


def test_each_instance_has_its_own_registry() -> None:
    a, b = PlannerMetrics(), PlannerMetrics()
    a.request_sent()
    assert value(a, "planner_inflight_requests", point="replay") == 1
    assert value(b, "planner_inflight_requests", point="replay") is None
    assert REGISTRY.get_sample_value("planner_inflight_requests", {"point": "replay"}) is None


def test_serves_metrics_on_loopback_and_stops() -> None:
    m = PlannerMetrics()
    port = m.start(host="127.0.0.1", port=0)
    try:
        m.request_sent()
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0)
        assert response.status_code == 200
        families = {f.name for f in text_string_to_metric_families(response.text)}
        assert {"planner_requests", "planner_inflight_requests", "planner_ttft_seconds"} <= families
    finally:
        m.stop()
    m.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2.0)


def test_a_busy_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port {port}: cannot listen"):
            PlannerMetrics().start(port=port)


def test_port_out_of_range() -> None:
    with pytest.raises(ConfigError, match="between 1 and 65535"):
        PlannerMetrics().start(port=70000)
