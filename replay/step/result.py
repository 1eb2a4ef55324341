"""A step's result as one pure function: what its sending and its window left behind (the
records), what vLLM's /metrics said over it (the snapshots), and the SLOs, in; a `StepResult`
out. No server, no clock: unit tests build the inputs by hand (tests/unit/test_step_result.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from replay.load.kinds import Load
from replay.records import RequestRecord
from replay.results import ServerSummary, SessionSummary, SloPooled, StepResult, updated
from replay.server.crosscheck import TTFT_EXCESS_FRACTION, TTFT_EXCESS_MS, cross_check
from replay.server.metrics import MetricsScraper, Sample
from replay.server.metrics import summarize as summarize_server
from replay.slo import max_rules
from replay.slo import rules as slo_mod
from replay.slo.exceedance import exceedance_tests
from replay.stats.across_steps import Check, Spread, checks, pooled_check
from replay.step.figures import build_result, client_summary, latency_samples, steady_records


@dataclass(frozen=True)
class StepRecords:
    """What a step's sending and its window left behind (times on the client's clock)."""

    load: Load
    started_at: str
    # Requests of the warm-up; when the window opened and closed, and why it closed.
    warmup: int
    open_s: float
    close_s: float
    closed_by: str | None
    # The window's time limit, and the warm-up's mean request duration it was sized from.
    limit_s: float | None
    request_duration_s: float | None
    # Requests sent inside the window that finished in it; every request that finished in it;
    # those that finished after it closed.
    measured: Sequence[RequestRecord]
    finished_inside: Sequence[RequestRecord]
    drained: int
    # When every request of the step finished (warm-up and drain included).
    finish_times: Sequence[float]
    # How late open-loop sends left, and how late the event loop woke, in seconds.
    send_lags: Sequence[float]
    loop_lags: Sequence[float]


@dataclass(frozen=True)
class MetricSnapshots:
    """What vLLM's /metrics said over a step: the gauge and counter samples, why figures are
    missing (None: none are), the histograms' figures over the window, when the histograms were
    snapshotted at the window's edges (None: not both were), and how far outside the window a
    sample may lie and still speak for its edge (MetricsScraper.edge_gap_s; None: any)."""

    samples: Sequence[Sample]
    note: str | None
    histograms: dict[str, object]
    window: tuple[float, float] | None
    edge_gap_s: float | None = None

    @classmethod
    def of(cls, scraper: MetricsScraper) -> MetricSnapshots:
        snaps = scraper.snapshots
        window = (snaps["start"].t_s, snaps["end"].t_s) if "start" in snaps and "end" in snaps else None
        return cls(list(scraper.samples), scraper.note, scraper.window_histograms(), window, scraper.edge_gap_s)


class SessionFigures(Protocol):
    """A session corpus's record of the step (replay.load.conversation.SessionRunner)."""

    def summary(
        self, measured: Sequence[RequestRecord], finished_inside: Sequence[RequestRecord], t0: float, t1: float
    ) -> SessionSummary: ...


def server_summary(
    metrics: MetricSnapshots | None, open_s: float, close_s: float, finished_inside: int = 0
) -> ServerSummary:
    """vLLM's figures over the window: gauges and counters, then its histograms.

    `finished_inside` requests finished in the window, so vLLM ran at least one at some moment.
    Where every sample still read none running, no sample caught that moment: the engine ran the
    requests between scrapes (on a small machine a fast engine finishes a burst of requests long
    before a client starved of CPU has read their streams, and /metrics is answered late). The
    peaks are then unknown, never 0: null, flagged `samples_saw_no_work`, and the note says so.
    The KV rule, judged on the share of samples above its bound (replay.slo.max_rules), is then
    undecided too: a share of 0 from samples that saw no work would read nothing as 0."""
    server = (
        summarize_server(
            metrics.samples, open_s, close_s, metrics.note, max_edge_gap_s=metrics.edge_gap_s, marks=metrics.window
        )
        if metrics is not None
        else ServerSummary(metrics_available=False, metrics_note="metrics scraping was off")
    )
    if finished_inside and server.samples and server.running_peak == 0:
        missed = (
            f"every /metrics sample of the window ({server.samples}) read 0 requests running while"
            f" {finished_inside} finished in it: no sample caught one running, so the running, KV and"
            " waiting peaks are unknown"
        )
        server = updated(
            server, running_peak=None, kv_cache_usage_peak=None, waiting_peak=None, samples_saw_no_work=True,
            metrics_note=f"{missed}; {server.metrics_note}" if server.metrics_note else missed,
        )
    if metrics is not None:
        server = updated(server, **metrics.histograms)
    return server


def client_finished(records: StepRecords, metrics: MetricSnapshots | None) -> int:
    """The client's finished requests between the server's two snapshots (what the server's
    histograms count), else inside the window."""
    if metrics is not None and metrics.window is not None:
        t0, t1 = metrics.window
        return sum(1 for t in records.finish_times if t0 < t <= t1)
    return len(records.finished_inside)


def slo_fields(
    result: StepResult, records: StepRecords, slo: dict[str, float], max_requests: int | None,
    spread: Spread | None = None, min_requests: int | None = None,
) -> dict:
    """The step's verdicts: each rule's, and the step's, and the test that passed each percentile
    rule (replay.slo.exceedance). A window that ran out of time before its bounds were finite,
    with nothing shown broken, is unresolved rather than failed. Percentile rules are judged
    across steps (replay.stats.across_steps), with what `spread` says of the point's earlier
    steps; their intervals and taus are kept."""
    spec = records.load.spec()
    samples = latency_samples(list(records.measured), spec)
    rule_verdicts, unverified = slo_mod.verdicts(result, slo, samples, spread, min_requests)
    verdict = slo_mod.step_verdict(rule_verdicts)
    across = checks(slo, samples, spread)
    if records.closed_by in max_rules.SHORT_CLOSES and verdict != "pass":
        if slo_mod.only_short_of_time(result, slo, rule_verdicts, max_requests):
            verdict = "unresolved"
    return dict(
        slo_pass=verdict == "pass",
        # Every SLO that kept the step from passing: broken, or not shown to hold.
        slo_violations=[k for k, v in rule_verdicts.items() if v != "pass"],
        slo_unverified=unverified,
        slo_verdict=verdict,
        slo_verdicts=rule_verdicts,
        slo_exceedance=exceedance_tests(samples, slo, rule_verdicts),
        slo_views={key: slo_mod.view(key) for key in slo},
        slo_ci95={key: list(c.ci95) for key, c in across.items()},
        slo_tau={key: round(c.own_tau, 3) for key, c in across.items()},
        slo_tau_bound={key: round(c.bound_tau, 3) for key, c in across.items()},
        slo_margin_log_sd={key: round(c.log_sd, 4) for key, c in across.items() if c.log_sd},
        slo_pooled=pooled_fields(result, slo, across, spread),
    )


def pooled_fields(
    result: StepResult, slo: dict[str, float], across: dict[str, Check], spread: Spread | None
) -> dict[str, SloPooled]:
    """Each percentile rule the step alone left undecided and the steps around its load decided
    (replay.stats.across_steps.pooled_check): what they showed."""
    out: dict[str, SloPooled] = {}
    for key, check in across.items():
        if check.sign != 0 or spread is None:
            continue
        pooled = pooled_check(spread, key, slo[key], result)
        if pooled is not None:
            out[key] = SloPooled(
                verdict="pass" if pooled.sign == 1 else "fail",
                loads=[round(x, 3) for x in pooled.loads],
                figure=round(pooled.estimate, 3),
                ci95=[round(pooled.ci95[0], 3), round(pooled.ci95[1], 3)],
            )
    return out


def step_result(
    records: StepRecords,
    metrics: MetricSnapshots | None,
    slo: dict[str, float] | None,
    *,
    max_requests: int | None = None,
    min_requests: int | None = None,
    sessions: SessionFigures | None = None,
    ttft_excess: tuple[float, float] = (TTFT_EXCESS_MS, TTFT_EXCESS_FRACTION),
    spread: Spread | None = None,
) -> StepResult:
    """The step's result: its figures (replay.step.figures), vLLM's over the same window, the
    client checked against them (replay.server.crosscheck), the sessions' figures, and the SLO
    verdicts. `max_requests` and `min_requests` are the window's (an unresolved verdict needs the
    first; the strict preemption rule's minimum observation, the second); `spread` what the
    point's earlier steps say (replay.stats.across_steps)."""
    spec = records.load.spec()
    result = build_result(
        spec=spec,
        started_at=records.started_at,
        warmup=records.warmup,
        window_s=records.close_s - records.open_s,
        measured=list(records.measured),
        finished_inside=list(records.finished_inside),
        drained=records.drained,
        server=server_summary(metrics, records.open_s, records.close_s, len(records.finished_inside)),
        client=client_summary(records.load, list(records.send_lags), list(records.loop_lags)),
        window_open_s=records.open_s,
        slo=slo,
    )
    excess_ms, excess_fraction = ttft_excess
    result = updated(
        result,
        client=cross_check(
            result, client_finished(records, metrics), excess_ms=excess_ms, excess_fraction=excess_fraction
        ),
        window_closed_by=records.closed_by,
        window_limit_s=None if records.limit_s is None else round(records.limit_s, 3),
        request_duration_s=None if records.request_duration_s is None else round(records.request_duration_s, 4),
    )
    if sessions is not None:
        measured = steady_records(list(records.measured), spec)[0]
        result = updated(
            result, sessions=sessions.summary(measured, records.finished_inside, records.open_s, records.close_s)
        )
    if slo is not None:
        if metrics is not None:
            # The rules over a maximum are judged on figures of any window length (replay.slo.max_rules).
            measured = steady_records(list(records.measured), spec)[0]
            result = updated(
                result,
                **max_rules.figures(metrics.samples, records.open_s, records.close_s, measured, result, slo),
            )
        result = updated(result, **slo_fields(result, records, slo, max_requests, spread, min_requests))
    return result
