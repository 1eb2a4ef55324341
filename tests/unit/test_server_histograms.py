"""vLLM's histograms over a window: parsing, deltas and PromQL's quantile interpolation.

The fixtures are real /metrics texts of vLLM 0.32 (CPU build, the tiny model): `idle` and `busy`
come from one server (same `_created` stamps), `preempted` from a later one.
"""

from pathlib import Path

import pytest

from replay.server.histograms import histogram_quantile, parse_snapshot, window_figures
from replay.server.metrics import hit_rate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_metrics"
MODEL = "/models/tiny-llama"

pytestmark = pytest.mark.timeout(30)


def _snap(name: str, model: str | None = MODEL, t_s: float = 0.0):
    return parse_snapshot((FIXTURES / f"real-0.32-cpu-{name}.txt").read_text(), t_s, model)


def test_idle_to_busy_delta_on_real_metrics():
    figures = window_figures(_snap("idle"), _snap("busy", t_s=1.0))
    assert figures.note is None and not figures.counter_reset
    ttft = figures.latencies["ttft"]
    # busy: 22 first tokens, cumulative 0 (le 0.005), 1 (0.01), 2 (0.02), 22 (0.04); idle: all 0.
    assert ttft.count == 22
    assert ttft.mean == pytest.approx(0.5064594745635986 / 22 * 1e3)
    # rank = q x 22 falls in (0.02, 0.04], which holds 20 after 2 below it:
    # p50: 20 + 20 x (11 - 2) / 20 = 29 ms; p90: 20 + 20 x 17.8 / 20 = 37.8; p99: 20 + 20 x 19.78 / 20 = 39.78.
    assert (ttft.p50, ttft.p90, ttft.p99) == pytest.approx((29.0, 37.8, 39.78))
    assert ttft.p50_bucket_ms == ttft.p99_bucket_ms == (20.0, 40.0)
    itl = figures.latencies["itl"]
    assert itl.count == 435 and itl.mean == pytest.approx(1.6307124220005562 / 435 * 1e3)
    # Every gap below 10 ms: the first bucket, from 0: a p50 of 5 ms is all the resolution there is.
    assert itl.p50 == pytest.approx(5.0) and itl.p50_bucket_ms == (0.0, 10.0)
    queue = figures.latencies["queue"]
    assert queue.count == 2 and queue.mean == pytest.approx(0.0001874010000619819 / 2 * 1e3)
    assert queue.p99_bucket_ms == (0.0, 300.0)
    assert set(figures.latencies) == {"ttft", "itl", "tpot", "e2e", "queue", "prefill", "decode"}
    assert all(v is not None and v.count == 2 for k, v in figures.latencies.items() if k not in ("ttft", "itl"))
    assert figures.counters == {
        "prompt_tokens": 531.0,
        "generation_tokens": 457.0,
        "requests_finished": 2.0,
        # The recording's two requests shared nothing: 531 prompt tokens looked up, none found.
        "prefix_cache_queries": 531.0,
        "prefix_cache_hits": 0.0,
        "external_prefix_cache_queries": 0.0,
        "external_prefix_cache_hits": 0.0,
    }


def test_prefix_cache_hit_rate_over_a_window():
    busy = (FIXTURES / "real-0.32-cpu-busy.txt").read_text()
    hit = busy.replace('vllm:prefix_cache_hits_total{engine="0",model_name="/models/tiny-llama"} 0.0',
                       'vllm:prefix_cache_hits_total{engine="0",model_name="/models/tiny-llama"} 256.0')
    assert hit != busy
    figures = window_figures(_snap("idle"), parse_snapshot(hit, 1.0, MODEL))
    assert (figures.counters["prefix_cache_queries"], figures.counters["prefix_cache_hits"]) == (531.0, 256.0)
    assert hit_rate(figures.counters["prefix_cache_hits"], figures.counters["prefix_cache_queries"]) == 0.4821
    # Nothing queried (an idle window) or no counter: no rate, rather than 0 or a division error.
    assert hit_rate(0.0, 0.0) is None and hit_rate(None, 531.0) is None


def test_same_snapshot_twice_gives_empty_figures():
    busy = _snap("busy")
    ttft = window_figures(busy, busy).latencies["ttft"]
    assert ttft.count == 0 and ttft.p99 is None and ttft.mean is None


@pytest.mark.parametrize(
    ("start", "end"),
    [("busy", "idle"), ("busy", "preempted"), ("preempted", "busy")],
    ids=["counts-went-down", "restarted-counts-went-up", "restarted-counts-went-down"],
)
def test_counter_reset_gives_null_and_says_so(start: str, end: str):
    figures = window_figures(_snap(start), _snap(end))
    assert figures.counter_reset
    assert figures.latencies == {} and figures.counters == {}
    assert "restarted" in figures.note


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    # 10 observations, 2 of them above the last finite bound (1.0).
    bounds = (0.1, 0.5, 1.0, float("inf"))
    counts = (4.0, 6.0, 8.0, 10.0)
    assert histogram_quantile(0.99, bounds, counts) == (1.0, 1.0, float("inf"))
    # rank 5 in (0.1, 0.5] holding 2 after 4: 0.1 + 0.4 x 1/2 = 0.3.
    assert histogram_quantile(0.5, bounds, counts) == pytest.approx((0.3, 0.1, 0.5))
    # rank 2 in the first bucket, from 0: 0.1 x 2/4.
    assert histogram_quantile(0.2, bounds, counts) == pytest.approx((0.05, 0.0, 0.1))
    # Non-monotonic counts (a scrape that is not atomic) are forced monotonic first, as PromQL does:
    # (4, 4, 8, 10), rank 5 in (0.5, 1.0] holding 4 after 4: 0.5 + 0.5 x 1/4.
    assert histogram_quantile(0.5, bounds, (4.0, 3.0, 8.0, 10.0)) == pytest.approx((0.625, 0.5, 1.0))
    assert histogram_quantile(0.5, bounds, (0.0, 0.0, 0.0, 0.0)) is None


def test_server_without_vllm_histograms():
    snap = parse_snapshot("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n", 0.0, "m")
    figures = window_figures(snap, snap)
    assert figures.latencies == {} and "no vLLM latency histograms" in figures.note
    assert "window's start" in window_figures(None, snap).note


def _hist(name: str, labels: str, counts: tuple[float, ...], total: float) -> str:
    bounds = ("0.01", "0.025", "+Inf")
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(bounds, counts)]
    lines += [f"{name}_count{{{labels}}} {counts[-1]}", f"{name}_sum{{{labels}}} {total}"]
    return "\n".join(lines) + "\n"


def test_older_itl_name_and_partial_histograms():
    # vLLM before the rename exports the per-token histogram as time_per_output_token_seconds.
    old = "vllm:time_per_output_token_seconds"
    start = parse_snapshot(_hist(old, 'model_name="m"', (1, 2, 2), 0.03), 0.0, "m")
    end = parse_snapshot(_hist(old, 'model_name="m"', (1, 12, 12), 0.2), 1.0, "m")
    figures = window_figures(start, end)
    itl = figures.latencies["itl"]
    assert itl.count == 10 and itl.mean == pytest.approx(17.0)
    # All 10 in (10, 25] ms: p50 = 10 + 15 x 5/10.
    assert itl.p50 == pytest.approx(17.5) and itl.p50_bucket_ms == (10.0, 25.0)
    assert figures.latencies["ttft"] is None
    assert "no vLLM histogram at /metrics for ttft, tpot, e2e, queue, prefill, decode" == figures.note


def test_the_current_itl_name_wins_over_the_older_one_wherever_it_comes():
    text = _hist("vllm:time_per_output_token_seconds", 'model_name="m"', (5, 5, 5), 0.01) + _hist(
        "vllm:inter_token_latency_seconds", 'model_name="m"', (0, 7, 7), 0.1
    )
    assert parse_snapshot(text, 0.0, "m").histograms["itl"].count == 7


def test_several_models_pick_the_served_one_and_engines_add_up():
    name = "vllm:time_to_first_token_seconds"
    text = (
        _hist(name, 'engine="0",model_name="a"', (1, 1, 1), 0.005)
        + _hist(name, 'engine="1",model_name="a"', (0, 3, 3), 0.05).split("\n", 1)[1]
        + _hist(name, 'engine="0",model_name="b"', (0, 0, 9), 9.0).split("\n", 1)[1]
    )
    snap = parse_snapshot(text, 0.0, "a")
    assert snap.model == "a"
    h = snap.histograms["ttft"]
    assert h.counts == (1.0, 4.0, 4.0) and h.count == 4 and h.sum == pytest.approx(0.055)
    assert parse_snapshot(text, 0.0, "b").histograms["ttft"].count == 9
    unknown = parse_snapshot(text, 0.0, "c")
    assert unknown.histograms == {} and "several models (a, b)" in unknown.note and "(c)" in unknown.note
    # One model only: it is the served one whatever name the client used (an alias).
    assert parse_snapshot(_hist(name, 'model_name="a"', (1, 1, 1), 0.005), 0.0, "alias").model == "a"


def test_not_prometheus_text_raises_value_error():
    with pytest.raises(ValueError):
        parse_snapshot('vllm:time_to_first_token_seconds_bucket{le="0.1" 1\n', 0.0, None)
