"""A step's result from its records: the figures, their intervals, attainment and goodput, with
the steady-state rule applied (replay.stats.steady). Pure functions of the records, so the window's
stopping rule (replay.step.window) and the final result compute them the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from replay.load.kinds import Concurrency, Load
from replay.records import RequestRecord
from replay.results import ClientSummary, ServerSummary, StepResult, updated
from replay.server.crosscheck import itl_gaps_ms
from replay.slo import rules as slo_mod
from replay.stats import intervals, samples as stats
from replay.stats.steady import steady_start

# Above these the client, not the server, may have been the limit: its own timing is suspect.
CLIENT_SEND_LAG_LIMIT_MS = 50.0
CLIENT_LOOP_LAG_LIMIT_MS = 50.0


def client_summary(load: Load, send_lags_s: list[float], loop_lags_s: list[float]) -> ClientSummary:
    send_p99 = stats.lag_p99_ms(send_lags_s) if not isinstance(load, Concurrency) else None
    loop_p99 = stats.lag_p99_ms(loop_lags_s)
    notes = []
    if send_p99 is not None and send_p99 > CLIENT_SEND_LAG_LIMIT_MS:
        notes.append(f"requests left {send_p99:.0f} ms late (p99) against their schedule")
    if loop_p99 is not None and loop_p99 > CLIENT_LOOP_LAG_LIMIT_MS:
        notes.append(f"the client's event loop lagged {loop_p99:.0f} ms (p99)")
    return ClientSummary(
        send_lag_p99_ms=send_p99,
        loop_lag_p99_ms=loop_p99,
        client_limited=bool(notes),
        note="; ".join(notes) + ": the client, not the server, may have been the limit" if notes else None,
    )


def _out_tokens(r: RequestRecord) -> int:
    return r.completion_tokens if r.completion_tokens is not None else len(r.token_times_s)


def throughput(done_ok: list[RequestRecord], window_s: float, window_open_s: float | None) -> dict:
    """Requests and tokens a second over the window, from the requests that finished in it, with
    95% intervals on the rates when the window's start is known."""
    duration = max(window_s, 1e-9)
    prompt_counts = [r.prompt_tokens for r in done_ok]
    input_tps = (
        sum(prompt_counts) / duration if done_ok and all(c is not None for c in prompt_counts) else None
    )
    output_tokens = sum(_out_tokens(r) for r in done_ok)
    rps_ci = tps_ci = None
    if window_open_s is not None and done_ok:
        ends = [r.end_s for r in done_ok]
        rps_ci = list(intervals.rate_interval(ends, [1.0] * len(ends), window_open_s, window_open_s + window_s))
        tps_ci = list(intervals.rate_interval(ends, [_out_tokens(r) for r in done_ok], window_open_s, window_open_s + window_s))
    return dict(
        requests_per_s=len(done_ok) / duration,
        input_tokens_per_s=input_tps,
        output_tokens_per_s=output_tokens / duration,
        requests_per_s_ci95=rps_ci,
        output_tokens_per_s_ci95=tps_ci,
    )


def build_result(
    *,
    spec,
    started_at: str,
    warmup: int,
    window_s: float,
    measured: list[RequestRecord],
    finished_inside: list[RequestRecord],
    drained: int,
    server: ServerSummary,
    client: ClientSummary,
    window_open_s: float | None = None,
    slo: Mapping[str, float] | None = None,
) -> StepResult:
    measured, dropped = steady_records(measured, spec)
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    errors = Counter(r.error for r in failed)
    samples: dict[str, str] = {}
    for r in failed:
        samples.setdefault(r.error, (r.error_detail or "")[:300])
    done_ok = [r for r in finished_inside if r.ok]
    duration = max(window_s, 1e-9)
    sources = {r.tokens_source for r in done_ok}
    tokens_source = "none" if not sources else (sources.pop() if len(sources) == 1 else "mixed")
    itl_gaps, bursts, burst_gaps = itl_gaps_ms(ok)
    client = updated(
        client, itl_bursts=bursts, itl_burst_gaps=burst_gaps, connect_retries=sum(r.connect_retries for r in measured)
    )
    attained = _attained(measured, slo) if slo else None
    attainment = float(attained.mean()) if attained is not None and attained.size else None
    return StepResult(
        load=spec,
        started_at=started_at,
        warmup_requests=warmup,
        window_s=window_s,
        requests_ok=len(ok),
        requests_failed=len(failed),
        requests_drained=drained,
        errors=dict(errors),
        error_samples=samples,
        ttft_ms=stats.summarize(stats.ttft_ms(ok)),
        itl_ms=stats.summarize(itl_gaps),
        tpot_ms=stats.summarize(stats.tpot_ms(ok)),
        e2e_ms=stats.summarize(stats.e2e_ms(ok)),
        **throughput(done_ok, window_s, window_open_s),
        tokens_source=tokens_source,
        server=server,
        client=client,
        slo_pass=True,
        slo_attainment=attainment,
        slo_attainment_ci95=list(intervals.proportion_interval(attained)) if attainment is not None else None,
        goodput_requests_per_s=None if attainment is None else len(done_ok) / duration * attainment,
        steady_state_dropped=dropped,
    )


def steady_records(measured: list[RequestRecord], spec) -> tuple[list[RequestRecord], int]:
    """The measured requests a result is computed from, in arrival order (the intervals read the
    sample's autocorrelation from it), and how many leading ones the steady-state rule dropped.
    A trace is replayed as recorded, start included: there is no steady state to wait for."""
    ordered = sorted(measured, key=lambda r: r.send_s)
    dropped = _unsteady(ordered) if spec.mode != "trace" else 0
    return ordered[dropped:], dropped


def latency_samples(measured: list[RequestRecord], spec) -> dict[str, np.ndarray]:
    """Each latency metric's values over the requests build_result keeps, in arrival order."""
    ok = [r for r in steady_records(measured, spec)[0] if r.ok]
    # ITL as the step reports it: gaps inside a burst (below the clock's resolution) left out.
    return {"ttft": stats.ttft_ms(ok), "itl": itl_gaps_ms(ok)[0], "tpot": stats.tpot_ms(ok), "e2e": stats.e2e_ms(ok)}


def _unsteady(measured: list[RequestRecord]) -> int:
    """Leading measured requests (in arrival order) before the steady state (replay.stats.steady),
    read on end-to-end latency; a failed request stands in with the slowest latency seen."""
    if not measured:
        return 0
    e2e = [r.e2e_s for r in measured if r.ok]
    worst = max(e2e, default=0.0)
    return steady_start([r.e2e_s if r.ok else worst for r in measured])


def _attained(measured: list[RequestRecord], slo: Mapping[str, float]) -> np.ndarray | None:
    """Per measured request (arrival order): did it succeed and meet every per-request bound?
    None when the SLOs bound no per-request latency."""
    bounds = slo_mod.per_request_bounds(slo)
    if not bounds:
        return None
    hits = []
    for r in measured:
        ok = r.ok
        if ok and "ttft" in bounds:
            ok = r.ttft_s is not None and r.ttft_s * 1e3 <= bounds["ttft"]
        if ok and "e2e" in bounds:
            ok = r.e2e_s * 1e3 <= bounds["e2e"]
        if ok and "tpot" in bounds:
            tpot = stats.tpot_ms([r])
            # A one-token answer has no TPOT to break.
            ok = tpot.size == 0 or float(tpot[0]) <= bounds["tpot"]
        hits.append(ok)
    return np.asarray(hits, dtype=bool)
