"""Made-up results for tests: step results, request records, the saved sweep fixture, and a
reader of the exporter's series."""

from __future__ import annotations

from pathlib import Path

from planner.exporter import PlannerMetrics
from planner.sweep.results import SweepResults
from replay.records import RequestRecord
from replay.results import ClientSummary, LatencySummary, LoadSpec, ServerSummary, StepResult

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"


def sweep_fixture() -> SweepResults:
    """The saved sweep (tests/fixtures/results/sweep/sweep.json) the report tests render."""
    return SweepResults.model_validate_json((FIXTURES / "sweep" / "sweep.json").read_text())


def value(metrics: PlannerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def record(ttft_s: float = 0.1, gaps_s: tuple[float, ...] = (0.02, 0.03), error: str | None = None) -> RequestRecord:
    times = [10.0 + ttft_s]
    for gap in gaps_s:
        times.append(times[-1] + gap)
    return RequestRecord(
        request_id="r", send_s=10.0, end_s=times[-1] + 0.001, first_token_s=None if error else times[0],
        token_times_s=[] if error else times, error=error,
    )


def finished_step(passed: bool) -> StepResult:
    empty = LatencySummary()
    return StepResult(
        load=LoadSpec(mode="concurrency", value=4), started_at="2026-07-14T10:00:00Z", warmup_requests=0,
        window_s=5.0, requests_ok=20, requests_failed=0, ttft_ms=empty, itl_ms=empty, tpot_ms=empty, e2e_ms=empty,
        requests_per_s=4.0, input_tokens_per_s=None, output_tokens_per_s=321.0, tokens_source="usage",
        server=ServerSummary(), client=ClientSummary(), slo_pass=passed,
    )


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
