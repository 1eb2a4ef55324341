"""The client's view against the server's: bursts of chunks, and latency the client side added."""

import pytest

from replay.records import RequestRecord
from replay.results import LatencySummary, ServerLatency, ServerSummary
from replay.server.crosscheck import cross_check, itl_gaps_ms
from tests.fakes.results import make_step

pytestmark = pytest.mark.timeout(30)


def _rec(times: list[float]) -> RequestRecord:
    return RequestRecord("r", send_s=0.0, end_s=times[-1], first_token_s=times[0], token_times_s=times)


def test_chunks_read_together_are_bursts_not_zero_gaps():
    # Chunks 2-4 came in one read (one timestamp), then 5, then 6-7 together.
    rec = _rec([0.10, 0.13, 0.13, 0.13, 0.15, 0.19, 0.19])
    gaps, bursts, burst_gaps = itl_gaps_ms([rec, _rec([0.5, 0.52]), RequestRecord("x", 0, 1, error="timeout")])
    assert (bursts, burst_gaps) == (2, 3)
    assert gaps == pytest.approx([30.0, 20.0, 40.0, 20.0])


def test_client_ttft_well_above_the_servers_is_flagged_with_the_figures():
    server = ServerSummary(
        metrics_available=True,
        ttft_ms=ServerLatency(count=90, mean=50.0),
        tpot_ms=ServerLatency(count=90, mean=15.0),
        requests_finished=97,
    )
    step = make_step(server=server, ttft_ms=LatencySummary(mean=75.0), tpot_ms=LatencySummary(mean=16.0))
    client = cross_check(step, 100)
    assert client.requests_finished == 100 and client.requests_minus_server == 3
    assert client.ttft_mean_minus_server_ms == pytest.approx(25.0)
    assert client.tpot_mean_minus_server_ms == pytest.approx(1.0)
    assert client.client_or_network_latency
    assert "75.0 ms" in client.latency_note and "not the engine" in client.latency_note
    # Within the larger of 10 ms and 10 % of the server's figure: not flagged.
    near = make_step(server=server, ttft_ms=LatencySummary(mean=59.0))
    assert not cross_check(near, 100).client_or_network_latency
    slow_server = server.model_copy(update={"ttft_ms": ServerLatency(count=90, mean=500.0)})
    assert not cross_check(make_step(server=slow_server, ttft_ms=LatencySummary(mean=545.0)), 100).client_or_network_latency
    assert cross_check(make_step(server=slow_server, ttft_ms=LatencySummary(mean=555.0)), 100).client_or_network_latency


def test_without_server_histograms_there_is_nothing_to_compare():
    client = cross_check(make_step(), 10)
    assert client.requests_finished == 10
    assert client.ttft_mean_minus_server_ms is None and client.requests_minus_server is None
    assert not client.client_or_network_latency


def test_the_replay_summary_warns_about_client_side_latency_and_resets():
    from planner.tables import replay_summary
    from replay.results import ClientSummary, CorpusInfo, ReplayResults

    flagged = make_step(client=ClientSummary(client_or_network_latency=True, latency_note="client added 25.0 ms"))
    reset = make_step(server=ServerSummary(metrics_available=True, counter_reset=True, histograms_note="counters went back"))
    results = ReplayResults(
        started_at="t", url="u", model="m", api="completions", corpus=CorpusInfo(path="c", sha256="s", requests=1),
        settings={}, slo={}, steps=[flagged, reset],
    )
    assert replay_summary(results) == [
        "warning: c=4: client added 25.0 ms",
        "warning: c=4: counters went back",
    ]
