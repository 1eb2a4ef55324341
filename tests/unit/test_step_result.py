"""replay.step.result.step_result: a step's result from records, metric snapshots and SLOs made up
by hand, with no server, no client and no clock."""

from __future__ import annotations

import math

from replay.load.kinds import Concurrency, PoissonRate
from replay.records import RequestRecord
from replay.server.metrics import Sample
from replay.slo.rules import verdicts
from replay.stats.across_steps import Figure, Spread
from replay.step.result import MetricSnapshots, StepRecords, client_finished, server_summary, step_result
from tests.fakes.results import make_step


def rec(i: int, send_s: float, *, ttft_s: float = 0.05, gap_s: float = 0.02, tokens: int = 5, error: str | None = None) -> RequestRecord:
    first = send_s + ttft_s
    times = [first + k * gap_s for k in range(tokens)]
    return RequestRecord(
        request_id=f"r{i}", send_s=send_s, end_s=times[-1], first_token_s=None if error else first,
        token_times_s=[] if error else times, prompt_tokens=10, completion_tokens=0 if error else tokens,
        error=error,
    )


def records(measured: list[RequestRecord], *, closed_by: str = "requests", load=None, **over) -> StepRecords:
    fields = dict(
        load=load or Concurrency(4), started_at="2026-01-01T00:00:00+00:00", warmup=4, open_s=10.0, close_s=20.0,
        closed_by=closed_by, limit_s=60.0, request_duration_s=0.13, measured=measured, finished_inside=measured,
        drained=2, finish_times=[r.end_s for r in measured], send_lags=[], loop_lags=[0.001] * 10,
    )
    return StepRecords(**(fields | over))


def steady(n: int, **kw) -> list[RequestRecord]:
    return [rec(i, 10.0 + i * 0.05, **kw) for i in range(n)]


def test_figures_and_window_facts_without_metrics():
    result = step_result(records(steady(100)), None, None)
    assert result.requests_ok == 100 and result.requests_failed == 0 and result.requests_drained == 2
    assert result.window_s == 10.0 and result.window_closed_by == "requests"
    assert result.window_limit_s == 60.0 and result.request_duration_s == 0.13
    assert abs(result.ttft_ms.p50 - 50.0) < 1e-6 and abs(result.tpot_ms.p50 - 20.0) < 1e-6
    # No scraper: the server's side says why it is empty; no SLOs: no verdict.
    assert not result.server.metrics_available and result.server.metrics_note == "metrics scraping was off"
    assert result.slo_verdict is None and result.slo_verdicts == {}


def test_verdicts_pass_and_fail_on_the_bound():
    measured = steady(400)
    passed = step_result(records(measured), None, {"tpot_p50_ms": 30, "error_rate": 0})
    assert passed.slo_verdict == "pass" and passed.slo_pass and passed.slo_violations == []
    assert passed.slo_views == {"tpot_p50_ms": "client", "error_rate": "client"}
    failed = step_result(records(measured), None, {"tpot_p50_ms": 10})
    assert failed.slo_verdict == "fail" and not failed.slo_pass and failed.slo_violations == ["tpot_p50_ms"]


def test_a_window_short_of_time_is_unresolved_not_failed():
    # Ten requests cannot show a p99 holds; nothing is shown broken either: out of time, unresolved.
    slo = {"ttft_p99_ms": 100}
    timed_out = step_result(records(steady(10), closed_by="time"), None, slo, max_requests=400)
    assert timed_out.slo_verdict == "unresolved" and not timed_out.slo_pass
    # The same sample closed on its request count is a plain failure to show the bound holds.
    closed = step_result(records(steady(10), closed_by="requests"), None, slo, max_requests=400)
    assert closed.slo_verdict != "unresolved" and not closed.slo_pass


def test_server_figures_come_from_the_snapshots_inside_the_window():
    samples = [
        Sample(t_s=9.0, kv_cache_usage=0.1, running=1, waiting=0, preemptions=3),
        Sample(t_s=12.0, kv_cache_usage=0.5, running=4, waiting=2, preemptions=3),
        Sample(t_s=19.0, kv_cache_usage=0.7, running=4, waiting=1, preemptions=5),
        # The scrape asked for as the window closed: the counter is read at both edges.
        Sample(t_s=20.4, kv_cache_usage=0.6, running=4, waiting=1, preemptions=5, sent_s=20.0),
    ]
    metrics = MetricSnapshots(samples=samples, note=None, histograms={}, window=None)
    result = step_result(records(steady(100)), metrics, {"max_preemptions": 0})
    assert result.server.metrics_available
    assert result.server.kv_cache_usage_peak == 0.7 and result.server.waiting_peak == 2
    assert result.server.preemptions == 2
    assert result.slo_verdicts["max_preemptions"] == "fail" and result.slo_views["max_preemptions"] == "server"


def test_no_preemption_in_a_window_out_of_time_short_of_its_minimum_is_unresolved_not_passed():
    # The counter read 0 preemptions at both edges of a window that ran out of time with 12
    # measured requests: the strict rule did not observe its minimum.
    samples = [
        Sample(t_s=9.0, kv_cache_usage=0.1, running=4, waiting=0, preemptions=0),
        Sample(t_s=15.0, kv_cache_usage=0.5, running=4, waiting=0, preemptions=0),
        Sample(t_s=20.4, kv_cache_usage=0.5, running=4, waiting=0, preemptions=0, sent_s=20.0),
    ]
    metrics = MetricSnapshots(samples=samples, note=None, histograms={}, window=None)
    slo = {"max_preemptions": 0}
    short = step_result(records(steady(12), closed_by="time"), metrics, slo, max_requests=400, min_requests=100)
    assert short.preemptions_in_exposure == 0
    assert short.slo_verdicts == {"max_preemptions": "inconclusive"} and short.slo_verdict == "unresolved"
    # Closed on its own minimum of 12 requests, the same window observed what it was given.
    counted = step_result(records(steady(12), closed_by="requests"), metrics, slo, max_requests=400, min_requests=12)
    assert counted.slo_verdicts == {"max_preemptions": "pass"} and counted.slo_pass


def test_the_client_counts_finished_requests_between_the_server_snapshots():
    measured = steady(100)
    recs = records(measured)
    inside = MetricSnapshots(samples=[], note=None, histograms={}, window=(10.0, 11.0))
    assert client_finished(recs, inside) == sum(1 for r in measured if 10.0 < r.end_s <= 11.0)
    assert client_finished(recs, None) == 100


def test_an_open_loop_reports_its_send_lag():
    result = step_result(records(steady(100), load=PoissonRate(5.0, 0), send_lags=[0.2] * 100), None, None)
    assert result.client.send_lag_p99_ms == 200.0 and result.client.client_limited


def test_percentile_rules_are_judged_across_steps_with_the_spread():
    # TPOT 20 ms on every request against 21: a pass on the step's own interval. With the point's
    # between-step spread (replay.stats.across_steps), 20 is inside the margin: inconclusive.
    slo = {"tpot_p50_ms": 21}
    alone = step_result(records(steady(200)), None, slo)
    assert alone.slo_verdicts["tpot_p50_ms"] == "pass"
    assert set(alone.slo_ci95) == {"tpot_p50_ms"} and alone.slo_tau["tpot_p50_ms"] >= 1.0
    assert alone.slo_margin_log_sd == {}
    spread = Spread(log_sd={"tpot_p50_ms": 0.25})
    widened = step_result(records(steady(200)), None, slo, spread=spread)
    assert widened.slo_verdicts["tpot_p50_ms"] == "inconclusive" and widened.slo_verdict == "inconclusive"
    assert widened.slo_margin_log_sd == {"tpot_p50_ms": 0.25}
    lo, hi = widened.slo_ci95["tpot_p50_ms"]
    assert lo < 20.0 / 1.5 and hi > 20.0 * 1.5


def test_a_rule_undecided_alone_is_decided_on_the_steps_around_its_load():
    # The margin leaves TPOT p50 20 ms against 21 undecided; two steps just above the load read
    # 18 and 19 ms on tight intervals, with a small measured scatter: the pooled figure, 19 ms
    # or so, is below 21, and the step passes on it, saying so.
    slo = {"tpot_p50_ms": 21}
    figures = (Figure(4.5, math.log(18.0), 0.0004), Figure(4.8, math.log(19.0), 0.0004))
    spread = Spread(log_sd={"tpot_p50_ms": 0.25}, figures={"tpot_p50_ms": figures}, pool_sd={"tpot_p50_ms": 0.02})
    result = step_result(records(steady(200)), None, slo, spread=spread)
    assert result.slo_verdicts["tpot_p50_ms"] == "pass" and result.slo_verdict == "pass"
    pooled = result.slo_pooled["tpot_p50_ms"]
    assert pooled.verdict == "pass" and pooled.loads == [4.0, 4.5, 4.8] and pooled.ci95[1] < 21
    # Neighbours above the bound leave it undecided; nothing is recorded.
    above = (Figure(4.5, math.log(24.0), 0.0004), Figure(4.8, math.log(25.0), 0.0004))
    spread = Spread(log_sd={"tpot_p50_ms": 0.25}, figures={"tpot_p50_ms": above}, pool_sd={"tpot_p50_ms": 0.02})
    result = step_result(records(steady(200)), None, slo, spread=spread)
    assert result.slo_verdicts["tpot_p50_ms"] == "inconclusive" and result.slo_pooled == {}


def test_rules_over_a_maximum_are_judged_on_figures_of_any_length():
    # 300 requests; the first 100 the figures count (after the steady-state rule) end before
    # t = 22, and one preemption comes at t = 25, after them: outside the stated exposure.
    samples = [
        Sample(t_s=9.0, kv_cache_usage=0.5, running=4, waiting=0, preemptions=0),
        Sample(t_s=24.0, kv_cache_usage=0.5, running=4, waiting=0, preemptions=0),
        Sample(t_s=25.0, kv_cache_usage=0.99, running=4, waiting=0, preemptions=1),
        Sample(t_s=29.0, kv_cache_usage=0.98, running=4, waiting=0, preemptions=1),
        Sample(t_s=30.3, kv_cache_usage=0.5, running=4, waiting=0, preemptions=1, sent_s=30.0),
    ]
    metrics = MetricSnapshots(samples=samples, note=None, histograms={}, window=None)
    result = step_result(
        records(steady(300), close_s=30.0), metrics, {"max_preemptions": 0, "kv_cache_usage_max": 0.95}
    )
    assert result.preemptions_in_exposure == 0.0 and result.slo_verdicts["max_preemptions"] == "pass"
    assert result.preemptions_per_request == 1 / result.requests_ok and result.preemptions_per_request_ci95[0] > 0
    # Two samples of three inside the window are above the bound: two thirds of its time, and over
    # 5% even had the window had the 20 samples the share is judged on, a fail.
    assert result.kv_cache_samples == 3
    assert abs(result.kv_cache_above_share - 2 / 3) < 1e-9 and result.slo_verdicts["kv_cache_usage_max"] == "fail"


def test_samples_that_read_no_request_running_while_requests_finished_are_not_a_zero_peak():
    # The e2e prefix-cache test once read KV peak 0.0 and running peak 0.0 over a window in which
    # 120 requests finished: the engine ran them between scrapes answered seconds late.
    idle = [Sample(t_s=t, kv_cache_usage=0.0, running=0.0, waiting=0.0, preemptions=0.0) for t in (0.9, 3.0, 5.1)]
    metrics = MetricSnapshots(samples=idle, note=None, histograms={}, window=(0.9, 5.1), edge_gap_s=0.5)
    missed = server_summary(metrics, 1.0, 5.0, finished_inside=120)
    assert missed.samples_saw_no_work and missed.window_sampled and missed.samples == 3
    assert missed.running_peak is None and missed.kv_cache_usage_peak is None and missed.waiting_peak is None
    assert missed.preemptions == 0.0  # a counter's change is read at the edges, not caught in passing
    assert missed.metrics_note.startswith(
        "every /metrics sample of the window (3) read 0 requests running while 120 finished in it"
    )
    # Nothing finished in the window: 0 running is what the samples saw, and it stands.
    quiet = server_summary(metrics, 1.0, 5.0, finished_inside=0)
    assert quiet.running_peak == 0.0 and quiet.kv_cache_usage_peak == 0.0 and not quiet.samples_saw_no_work
    assert quiet.metrics_note is None
    # One sample caught a request running: the peaks are read as measured.
    busy = sorted([*idle, Sample(t_s=2.0, kv_cache_usage=0.4, running=3.0, waiting=0.0, preemptions=0.0)], key=lambda s: s.t_s)
    caught = server_summary(
        MetricSnapshots(samples=busy, note=None, histograms={}, window=(0.9, 5.1), edge_gap_s=0.5), 1.0, 5.0,
        finished_inside=120,
    )
    assert caught.running_peak == 3.0 and caught.kv_cache_usage_peak == 0.4 and not caught.samples_saw_no_work


def test_rules_over_peaks_no_sample_caught_stay_undecided_unless_a_sample_broke_them():
    idle = [Sample(t_s=t, kv_cache_usage=0.0, running=0.0, waiting=0.0, preemptions=0.0) for t in (0.9, 3.0, 5.1)]
    missed = server_summary(MetricSnapshots(idle, None, {}, (0.9, 5.1), 0.5), 1.0, 5.0, finished_inside=120)
    # A share of 0 above the KV bound from samples that saw no work reads nothing as 0: undecided.
    # Samples above the bound are readings of the cache all the same: they fail it.
    judged, unverified = verdicts(make_step(server=missed, kv_cache_above_share=0.0), {"kv_cache_usage_max": 0.95})
    assert judged == {"kv_cache_usage_max": "inconclusive"} and unverified == []
    judged, _ = verdicts(make_step(server=missed, kv_cache_above_share=0.5), {"kv_cache_usage_max": 0.95})
    assert judged == {"kv_cache_usage_max": "fail"}
    # Without that share (no sample inside the window), and for a bound on the waiting peak: undecided,
    # never passed unseen.
    judged, _ = verdicts(make_step(server=missed), {"kv_cache_usage_max": 0.95, "max_waiting": 0})
    assert judged == {"kv_cache_usage_max": "inconclusive", "max_waiting": "inconclusive"}
