from replay.server.metrics import Sample, parse_sample, summarize

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.83
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 12.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",kv_cache_size_tokens="8192",num_gpu_blocks="64",engine="0"} 1.0
"""


def test_parse_vllm_sample():
    s = parse_sample(VLLM_TEXT, 1.0)
    assert (s.kv_cache_usage, s.running, s.waiting, s.preemptions) == (0.83, 7.0, 3.0, 12.0)


def test_old_usage_name_and_two_engines():
    text = (
        'vllm:gpu_cache_usage_perc{engine="0"} 0.2\nvllm:gpu_cache_usage_perc{engine="1"} 0.6\n'
        'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 5\n'
    )
    s = parse_sample(text, 0.0)
    assert s.kv_cache_usage == 0.6 and s.running == 7 and s.preemptions is None


def test_server_without_vllm_metrics():
    assert parse_sample("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n", 0.0) is None
    summary = summarize([], 0, 1, None)
    assert summary.metrics_available is False and "no vllm" in summary.metrics_note


def test_window_peaks_and_preemption_delta():
    samples = [
        Sample(0.0, 0.1, 1, 0, 5),  # before the window: the counter's baseline
        Sample(1.0, 0.9, 8, 4, 7),
        Sample(2.0, 0.5, 6, 0, 9),
        Sample(3.0, 0.99, 9, 9, 30),  # after the first sample past the window: ignored
        Sample(4.0, 0.99, 9, 9, 40),
    ]
    s = summarize(samples, 0.5, 2.5, None)
    assert s.kv_cache_usage_peak == 0.99  # the first sample after the close still counts
    s = summarize(samples, 0.5, 2.0, None)
    assert (s.kv_cache_usage_peak, s.running_peak, s.waiting_peak, s.preemptions) == (0.9, 8, 4, 4)


def test_window_shorter_than_the_scrape_interval():
    samples = [Sample(0.0, 0.2, 1, 0, 0), Sample(1.0, 0.4, 2, 1, 1)]
    s = summarize(samples, 0.2, 0.4, None)
    assert s.samples == 2 and s.kv_cache_usage_peak == 0.4 and s.preemptions == 1


def _vllm_text(name: str) -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[1] / "fixtures" / "vllm_metrics" / f"real-0.32-cpu-{name}.txt").read_text()


def test_marks_snapshot_the_histograms_through_the_same_fetch():
    import asyncio

    from replay.server.metrics import MetricsScraper

    texts = iter([_vllm_text("idle"), _vllm_text("busy")])
    calls = []

    async def fetch():
        calls.append(1)
        return next(texts)

    async def main():
        scraper = MetricsScraper(fetch, model="/models/tiny-llama")
        scraper.mark("start")
        await asyncio.sleep(0)
        scraper.mark("end")
        await asyncio.gather(*scraper._marks)
        return scraper

    scraper = asyncio.run(main())
    assert len(calls) == 2 and len(scraper.samples) == 2
    fields = scraper.window_histograms()
    assert fields["ttft_ms"].count == 22 and fields["requests_finished"] == 2.0
    assert fields["histograms_note"] is None and fields["counter_reset"] is False


def test_a_failed_snapshot_is_a_note_not_an_error():
    import asyncio

    from replay.server.metrics import MetricsScraper

    async def broken():
        raise ConnectionError("refused")

    async def main():
        scraper = MetricsScraper(broken)
        scraper.mark("start")
        await asyncio.gather(*scraper._marks)
        return scraper

    fields = asyncio.run(main()).window_histograms()
    # No figures at all: the step's server latencies stay null.
    assert not any(v is not None for k, v in fields.items() if k.endswith("_ms"))
    assert fields["histograms_note"] == "scraping /metrics failed: ConnectionError: refused"


def test_samples_far_from_the_window_say_nothing_of_it():
    # The scrape before a long warm-up and the one after the drain read an idle server; a scrape
    # stalled through the window left nothing between them. Its peaks are unknown, not 0.
    samples = [Sample(0.0, 0.0, 0, 0, 3), Sample(30.0, 0.0, 0, 0, 9)]
    s = summarize(samples, 10.0, 14.0, None, max_edge_gap_s=2.0)
    assert s.metrics_available and not s.window_sampled and s.samples == 0
    assert (s.kv_cache_usage_peak, s.running_peak, s.waiting_peak, s.preemptions) == (None, None, None, None)
    assert s.metrics_note == (
        "no /metrics sample inside the 4.0 s window or within 2.0 s of it (the nearest: 10.0 s before it and"
        " 16.0 s after it): the window's gauges and preemptions are unknown"
    )


def test_samples_near_the_edges_still_speak_for_a_short_window():
    samples = [Sample(0.0, 0.0, 0, 0, 0), Sample(9.5, 0.3, 4, 0, 1), Sample(10.6, 0.5, 5, 1, 2), Sample(30.0, 0.0, 0, 0, 2)]
    s = summarize(samples, 10.0, 10.2, None, max_edge_gap_s=2.0)
    assert s.window_sampled and s.samples == 2
    assert (s.kv_cache_usage_peak, s.running_peak, s.preemptions) == (0.5, 5, 1)


def test_an_unsampled_window_leaves_the_server_rules_undecided():
    from replay.slo import rules as slo
    from tests.fakes.results import make_step

    unsampled = summarize([Sample(0.0, 0.0, 0, 0, 0)], 10.0, 14.0, None, max_edge_gap_s=2.0)
    st = make_step(server=unsampled)
    verdicts, unverified = slo.verdicts(st, {"kv_cache_usage_max": 0.9, "max_preemptions": 0})
    assert verdicts == {"kv_cache_usage_max": "inconclusive", "max_preemptions": "inconclusive"}
    assert set(unverified) == {"kv_cache_usage_max", "max_preemptions"}
    # A server without the figure at all is not held to it, as before.
    without = st.model_copy(update={"server": summarize([], 0, 1, None)})
    assert slo.verdicts(without, {"kv_cache_usage_max": 0.9})[0] == {}


def test_a_counter_that_missed_the_windows_end_is_a_lower_bound_not_a_count():
    # The last read came 6 s before the close (later scrapes stalled on a busy server): the
    # preemptions after it are unknown, so the window's count is too; what was seen is kept.
    samples = [Sample(9.8, 0.1, 2, 0, 0), Sample(11.0, 0.9, 30, 2, 3), Sample(40.0, 0.0, 0, 0, 20)]
    s = summarize(samples, 10.0, 17.0, None, max_edge_gap_s=1.0)
    assert s.window_sampled and s.preemptions is None and s.preemptions_at_least == 3
    assert "read only from -0.2 s to 1.0 s of the 7.0 s window (3 preemptions then)" in s.metrics_note
    # Nothing seen in that part: still unknown, never 0.
    quiet = [Sample(9.8, 0.1, 2, 0, 0), Sample(11.0, 0.2, 3, 0, 0)]
    s = summarize(quiet, 10.0, 17.0, None, max_edge_gap_s=1.0)
    assert s.preemptions is None and s.preemptions_at_least == 0


def test_the_end_mark_answered_late_still_speaks_for_the_close():
    # Asked for at the close, answered 4 s later (past the 1 s edge gap): it is the window's end.
    samples = [Sample(9.8, 0.1, 2, 0, 0), Sample(11.0, 0.9, 30, 2, 3), Sample(21.0, 1.0, 32, 5, 12, sent_s=17.0)]
    s = summarize(samples, 10.0, 17.0, None, max_edge_gap_s=1.0)
    assert (s.preemptions, s.preemptions_at_least, s.kv_cache_usage_peak) == (12, None, 1.0)
    # A scrape asked for long after the close does not.
    late = [*samples[:2], Sample(21.0, 0.0, 0, 0, 12, sent_s=20.0)]
    assert summarize(late, 10.0, 17.0, None, max_edge_gap_s=1.0).preemptions is None


def test_a_lower_bound_settles_the_preemption_rule_only_when_it_breaks_it():
    from replay.slo import rules as slo
    from tests.fakes.results import make_step

    seen = summarize([Sample(9.8, 0.1, 2, 0, 0), Sample(11.0, 0.9, 30, 2, 3)], 10.0, 17.0, None, max_edge_gap_s=1.0)
    verdicts, unverified = slo.verdicts(make_step(server=seen), {"max_preemptions": 0})
    assert verdicts == {"max_preemptions": "fail"} and unverified == []
    none_seen = summarize([Sample(9.8, 0.1, 2, 0, 0), Sample(11.0, 0.2, 3, 0, 0)], 10.0, 17.0, None, max_edge_gap_s=1.0)
    verdicts, unverified = slo.verdicts(make_step(server=none_seen), {"max_preemptions": 0})
    assert verdicts == {"max_preemptions": "inconclusive"} and unverified == ["max_preemptions"]


def test_scrapes_record_when_they_were_asked_for():
    import asyncio

    from replay.server.metrics import MetricsScraper

    async def slow():
        await asyncio.sleep(0.05)
        return _vllm_text("busy")

    async def main():
        scraper = MetricsScraper(slow, model="/models/tiny-llama", fetch_mark=slow)
        scraper.mark("end")
        await asyncio.gather(*scraper._marks)
        await scraper.scrape_once()
        return scraper

    for sample in asyncio.run(main()).samples:
        assert sample.sent_s is not None and sample.t_s - sample.sent_s >= 0.04


def test_the_window_marks_reach_its_edges_however_late_they_were_asked_for():
    # A client loop starved of CPU asked for the opening scrape 2.2 s after the window opened and
    # got it at 12.5; it is the edge vLLM's histograms are read at, so the counter's too.
    samples = [Sample(12.5, 0.2, 8, 0, 4, sent_s=12.2), Sample(20.0, 0.3, 8, 0, 6, sent_s=17.1)]
    s = summarize(samples, 10.0, 17.0, None, max_edge_gap_s=1.0, marks=(12.5, 20.0))
    assert (s.preemptions, s.preemptions_at_least) == (2, None)
    assert summarize(samples, 10.0, 17.0, None, max_edge_gap_s=1.0).preemptions is None


def test_an_aborted_step_does_not_wait_for_its_marks():
    import asyncio
    import time

    from replay.server.metrics import MetricsScraper

    async def hung():
        await asyncio.sleep(60)  # a server that accepts and never answers

    async def main():
        scraper = MetricsScraper(hung, fetch_mark=hung)
        scraper.mark("start")
        await asyncio.sleep(0.01)
        scraper.fetch = _answers  # the final scrape of stop() answers at once
        t0 = time.perf_counter()
        await scraper.stop(cancel_marks=True)
        return scraper, time.perf_counter() - t0

    async def _answers():
        return None

    scraper, took = asyncio.run(main())
    assert took < 5 and "start" not in scraper.snapshots


def test_the_closing_mark_asked_for_late_still_closes_the_count():
    # The loop asked for the closing scrape 1.6 s after the close (past the 1 s edge gap) and got
    # it at 21.0: it is the window's end all the same (a CI run read 74 preemptions up to 3.9 s
    # of a 5.0 s window and called the count unknown).
    samples = [Sample(10.1, 0.5, 30, 9, 0, sent_s=10.0), Sample(13.9, 1.0, 39, 30, 74), Sample(21.0, 1.0, 39, 30, 90, sent_s=16.6)]
    s = summarize(samples, 10.0, 15.0, None, max_edge_gap_s=1.0, marks=(10.1, 21.0))
    assert (s.preemptions, s.preemptions_at_least) == (90, None)


def test_stopping_for_a_hung_server_waits_for_no_scrape():
    import asyncio

    from replay.server.metrics import MetricsScraper

    # A server that accepts and never answers: every scrape, periodic or a window's mark, would
    # wait out its time-out (30 s for a mark). A step dropped because its server hung must not.
    async def never() -> str:
        await asyncio.Event().wait()
        return ""

    async def main() -> MetricsScraper:
        scraper = MetricsScraper(never, interval_s=0.01, fetch_mark=never)
        scraper.start()
        scraper.mark("start")
        await asyncio.sleep(0.05)
        # Before the fix this waited for ever on the periodic scrape (and 30 s on the mark).
        await asyncio.wait_for(scraper.stop(cancel_marks=True), 5)
        return scraper

    scraper = asyncio.run(main())
    assert all(t.done() for t in scraper._marks) and scraper._task.done()
