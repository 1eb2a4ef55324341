import pytest

from replay.errors import SloSpecError
from replay.results import LatencySummary, ServerLatency, ServerSummary
from replay.slo import rules as slo
from tests.fakes.results import make_step


def test_parse_default_expression():
    spec = "ttft_p99_ms=800,itl_p99_ms=60,e2e_p99_ms=20000,error_rate=0,max_preemptions=0,kv_cache_usage_max=0.95"
    # The expression spells out the defaults, key for key.
    assert slo.parse(spec) == slo.DEFAULT_SLO


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


def _with_ci(p99, ci):
    return make_step(tpot_ms=LatencySummary(mean=20, p50=18, p90=30, p95=40, p99=p99, max=60, ci95={"p99": ci}))


@pytest.mark.parametrize(
    "ci, verdict",
    [
        ([40.0, 50.0], "pass"),  # the whole interval at or below the bound
        ([40.0, 50.000001], "inconclusive"),  # its top just above
        ([50.000001, 55.0], "fail"),  # the whole interval above
        ([50.0, 55.0], "inconclusive"),  # its bottom on the bound: not shown to break it
        ([40.0, None], "inconclusive"),  # no finite upper bound yet
        ([None, None], "inconclusive"),
        ([51.0, None], "fail"),  # an open top does not matter once the bottom is above
    ],
)
def test_three_valued_verdicts_at_the_edges(ci, verdict):
    v, _ = slo.verdicts(_with_ci(45.0, ci), {"tpot_p99_ms": 50.0})
    assert v == {"tpot_p99_ms": verdict}
    assert slo.step_verdict(v) == verdict


def test_step_verdict_fail_wins_then_inconclusive():
    assert slo.step_verdict({"a": "pass", "b": "inconclusive", "c": "fail"}) == "fail"
    assert slo.step_verdict({"a": "pass", "b": "inconclusive"}) == "inconclusive"
    assert slo.step_verdict({"a": "pass"}) == slo.step_verdict({}) == "pass"


def test_samples_decide_a_percentile_against_its_bound():
    rules = {"tpot_p90_ms": 50.0}
    step = _with_ci(45.0, [None, None])
    far_below = [10.0 + 0.001 * i for i in range(100)]  # a slow drift, far under the bound
    assert slo.verdicts(step, rules, {"tpot": far_below})[0] == {"tpot_p90_ms": "pass"}
    assert slo.verdicts(step, rules, {"tpot": [100.0] * 100})[0] == {"tpot_p90_ms": "fail"}
    straddling = [40.0, 60.0] * 50  # half above: its p90 is above the bound
    assert slo.verdicts(step, rules, {"tpot": straddling})[0] == {"tpot_p90_ms": "fail"}
    assert slo.verdicts(step, rules, {"tpot": [40.0] * 89 + [60.0] * 11})[0] == {"tpot_p90_ms": "inconclusive"}


def test_attainment_is_a_lower_bound_with_its_own_interval():
    rules = {"min_slo_attainment": 0.9}
    assert slo.verdicts(make_step(slo_attainment=0.97, slo_attainment_ci95=[0.95, 0.99]), rules)[0] == {"min_slo_attainment": "pass"}
    assert slo.verdicts(make_step(slo_attainment=0.8, slo_attainment_ci95=[0.7, 0.85]), rules)[0] == {"min_slo_attainment": "fail"}
    assert slo.verdicts(make_step(slo_attainment=0.91, slo_attainment_ci95=[0.88, 0.94]), rules)[0] == {"min_slo_attainment": "inconclusive"}
    assert slo.evaluate(make_step(slo_attainment=None), rules)[0] == ["min_slo_attainment"]


def test_min_requests_follow_the_percentiles():
    assert slo.min_requests_for({}) == 100
    assert slo.min_requests_for({"tpot_p90_ms": 30, "e2e_p50_ms": 1}) == 100
    assert slo.min_requests_for({"ttft_p99_ms": 800}) == 368
    assert slo.min_requests_for({"min_slo_attainment": 0.995}) == 736
    assert slo.per_request_bounds({"ttft_p50_ms": 100, "ttft_p99_ms": 800, "itl_p99_ms": 5, "e2e_max_ms": 9}) == {"ttft": 800, "e2e": 9}
