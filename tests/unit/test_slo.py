import pytest

from replay import slo
from replay.errors import SloSpecError
from replay.results import ClientSummary, LatencySummary, LoadSpec, ServerSummary, StepResult


def make_step(**over) -> StepResult:
    base = dict(
        load=LoadSpec(mode="concurrency", value=4),
        started_at="2026-01-01T00:00:00+00:00",
        warmup_requests=4,
        window_s=10.0,
        requests_ok=99,
        requests_failed=1,
        ttft_ms=LatencySummary(mean=100, p50=90, p90=150, p95=180, p99=700, max=900),
        itl_ms=LatencySummary(mean=20, p50=18, p90=30, p95=40, p99=55, max=80),
        tpot_ms=LatencySummary(mean=20, p50=18, p90=30, p95=40, p99=50, max=60),
        e2e_ms=LatencySummary(mean=2000, p50=1900, p90=3000, p95=3500, p99=4000, max=5000),
        requests_per_s=10.0,
        input_tokens_per_s=1000.0,
        output_tokens_per_s=2000.0,
        tokens_source="usage",
        server=ServerSummary(metrics_available=True, kv_cache_usage_peak=0.5, preemptions=0, running_peak=4, waiting_peak=0),
        client=ClientSummary(),
        slo_pass=True,
    )
    base.update(over)
    return StepResult(**base)


def test_parse_default_expression():
    spec = "ttft_p99_ms=800,itl_p99_ms=60,e2e_p99_ms=20000,error_rate=0,max_preemptions=0,kv_cache_usage_max=0.95"
    assert slo.parse(spec) == {
        "ttft_p99_ms": 800.0,
        "itl_p99_ms": 60.0,
        "e2e_p99_ms": 20000.0,
        "error_rate": 0.0,
        "max_preemptions": 0.0,
        "kv_cache_usage_max": 0.95,
    }


def test_any_percentile_of_the_four_latencies():
    for metric in slo.LATENCY_METRICS:
        for stat in slo.LATENCY_STATS:
            assert slo.parse(f"{metric}_{stat}_ms=5") == {f"{metric}_{stat}_ms": 5.0}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ttft_p98_ms=5", "unknown SLO 'ttft_p98_ms'"),
        ("ttft_p99_ms", "is not key=value"),
        ("ttft_p99_ms=fast", "'fast' is not a number"),
        ("error_rate=2", "must be between 0 and 1"),
        ("itl_p99_ms=-1", "is negative"),
    ],
)
def test_bad_expressions_say_what_is_valid(spec, message):
    with pytest.raises(SloSpecError, match=message):
        slo.parse(spec)


def test_evaluate_pass_and_each_violation():
    rules = slo.parse("ttft_p99_ms=800,itl_p99_ms=60,error_rate=0.05,max_preemptions=0,kv_cache_usage_max=0.95")
    assert slo.evaluate(make_step(), rules) == ([], [])
    assert slo.evaluate(make_step(ttft_ms=LatencySummary(p99=801)), rules)[0] == ["ttft_p99_ms"]
    assert slo.evaluate(make_step(requests_failed=10, requests_ok=90), rules)[0] == ["error_rate"]
    busy = ServerSummary(metrics_available=True, kv_cache_usage_peak=0.99, preemptions=3)
    assert slo.evaluate(make_step(server=busy), rules)[0] == ["max_preemptions", "kv_cache_usage_max"]


def test_no_completed_requests_fails_latency_slos():
    step = make_step(requests_ok=0, requests_failed=0, ttft_ms=LatencySummary())
    violations, _ = slo.evaluate(step, {"ttft_p99_ms": 800, "error_rate": 0})
    assert violations == ["ttft_p99_ms", "error_rate"]


def test_server_slos_without_metrics_are_unverified_not_passed_silently():
    step = make_step(server=ServerSummary(metrics_available=False))
    assert slo.evaluate(step, {"max_preemptions": 0, "kv_cache_usage_max": 0.9}) == (
        [],
        ["max_preemptions", "kv_cache_usage_max"],
    )
