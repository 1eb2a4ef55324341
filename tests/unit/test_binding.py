"""The binding constraint names the rules that failed conclusively at the lowest failing step;
rules still undecided there are listed apart; a passing rule keeps the test that passed it."""

import asyncio

import numpy as np
import pytest

from replay.load.drivers import RequestCursor
from replay.load.kinds import Concurrency
from replay.search import binding
from replay.server.metrics import MetricsScraper
from replay.slo import exceedance
from replay.step.run import run_step
from replay.step.window import EARLY_SERVER_FAIL_REQUESTS, Window
from tests.fakes.senders import CORPUS, SleepySender
from tests.unit.test_sweep_outcome import step as outcome_step

KV_FULL = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.99\n'


def kv_gauge_step():
    """A step whose window vLLM's KV gauge closes early, long before its latency rules can tell."""

    async def metrics() -> str:
        return KV_FULL

    async def go():
        scraper = MetricsScraper(metrics, interval_s=0.01)
        slo = {"tpot_p99_ms": 30.0, "e2e_p99_ms": 1000.0, "kv_cache_usage_max": 0.95}
        window = Window(warmup_requests=0, min_requests=400, max_requests=1600, max_window_s=30.0)
        return await run_step(SleepySender(), RequestCursor(CORPUS), Concurrency(4), window, scraper=scraper, slo=slo)

    return asyncio.run(go())


@pytest.mark.timeout(30)
def test_a_step_closed_early_by_the_kv_gauge_is_bound_by_the_kv_rule_only():
    step = kv_gauge_step()
    assert step.window_closed_by == "verdict"
    n = binding.measured_requests(step)
    assert EARLY_SERVER_FAIL_REQUESTS <= n < 100
    # The latency rules were far inside their bounds but not yet shown to hold on so few requests.
    assert step.slo_verdicts["kv_cache_usage_max"] == "fail"
    assert binding.failed_rules(step) == ["kv_cache_usage_max"]
    bound = binding.binding([step], 4, None)
    assert bound.constraint == "kv_cache_usage_max"
    # A p99 needs about 300 independent requests for a finite upper bound (a p90 35, which a window
    # the KV rule closes may reach): both latency rules are undecided.
    assert sorted(bound.undecided) == [f"e2e_p99_ms: undecided after {n} requests", f"tpot_p99_ms: undecided after {n} requests"]
    assert binding.violations_text(step).startswith("kv_cache_usage_max")


def test_no_conclusive_failure_leaves_the_constraint_empty_and_lists_the_undecided():
    step = outcome_step(8, passed=False, tps=1.0).model_copy(
        update={"slo_verdict": "inconclusive", "slo_verdicts": {"ttft_p99_ms": "inconclusive"}, "requests_ok": 13, "requests_failed": 0}
    )
    bound = binding.binding([step], 8, None)
    assert bound.constraint is None
    assert bound.undecided == ["ttft_p99_ms: undecided after 13 requests"]
    assert binding.describe(bound.constraint, bound.undecided) == "- (undecided there: ttft_p99_ms: undecided after 13 requests)"


def test_a_capped_search_is_bound_by_its_cap():
    assert binding.binding([], None, "max_concurrency").constraint == "max_concurrency"


def test_the_exceedance_test_counts_what_exceeded_and_what_the_test_allows():
    rng = np.random.default_rng(7)
    values = rng.uniform(0, 10, 400)
    values[::50] = 50.0  # 8 of 400 above a bound of 20
    test = exceedance.exceedance_test(values, 0.9, 20.0)
    assert test is not None and test.exceeded == 8 and test.n == 400
    # A p90 allows up to about 10% (less its margin) above the bound.
    assert 8 <= test.allowed < 40
    assert exceedance.exceedance_text(test) == f"8 of 400 above the bound (at most {test.allowed} allowed)"
    # Too small a sample for a finite upper rank: no test.
    assert exceedance.exceedance_test([1.0], 0.99, 20.0) is None


def test_an_undecided_kv_rule_names_the_samples_it_was_judged_on():
    step = outcome_step(8, passed=False, tps=1.0).model_copy(
        update={
            "slo_verdict": "inconclusive", "slo_verdicts": {"kv_cache_usage_max": "inconclusive"},
            "kv_cache_above_share": 1 / 12, "kv_cache_samples": 12,
        }
    )
    assert binding.undecided_notes(step) == ["kv_cache_usage_max: undecided on 1 of 12 samples above the bound"]
