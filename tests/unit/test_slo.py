import pytest

from replay import slo
from replay.errors import SloSpecError
from replay.results import ClientSummary, LatencySummary, LoadSpec, ServerLatency, ServerSummary, StepResult


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


def test_server_keys_beside_the_client_ones():
    for metric in slo.SERVER_LATENCY_METRICS:
        for stat in slo.SERVER_LATENCY_STATS:
            assert slo.parse(f"server_{metric}_{stat}_ms=5") == {f"server_{metric}_{stat}_ms": 5.0}
    with pytest.raises(SloSpecError, match="keep no maximum"):
        slo.parse("server_ttft_max_ms=5")
    with pytest.raises(SloSpecError, match=r"unknown SLO 'server_prefill_p99_ms'.*server_<ttft\|itl\|tpot\|e2e\|queue>"):
        slo.parse("server_prefill_p99_ms=5")
    with pytest.raises(SloSpecError, match="is negative"):
        slo.parse("server_queue_p99_ms=-1")


def test_server_keys_are_judged_on_vllm_histograms():
    rules = {"server_ttft_p99_ms": 500, "server_queue_p99_ms": 100, "ttft_p99_ms": 800}
    server = ServerSummary(
        metrics_available=True,
        ttft_ms=ServerLatency(count=10, mean=300, p99=600),
        queue_ms=ServerLatency(count=10, mean=10, p99=50),
    )
    # The client's p99 (700) passes its 800; the server's (600) fails its 500.
    assert slo.evaluate(make_step(server=server), rules) == (["server_ttft_p99_ms"], [])
    # No request in the window: nothing met the target, as for the client's keys.
    empty = ServerSummary(metrics_available=True, ttft_ms=ServerLatency(count=0), queue_ms=ServerLatency(count=0))
    assert slo.evaluate(make_step(server=empty), rules)[0] == ["server_ttft_p99_ms", "server_queue_p99_ms"]
    # A server without the histograms: unverified, never passed silently.
    assert slo.evaluate(make_step(), rules) == ([], ["server_ttft_p99_ms", "server_queue_p99_ms"])
    assert {k: slo.view(k) for k in [*rules, "max_preemptions", "error_rate"]} == {
        "server_ttft_p99_ms": "server",
        "server_queue_p99_ms": "server",
        "ttft_p99_ms": "client",
        "max_preemptions": "server",
        "error_rate": "client",
    }
