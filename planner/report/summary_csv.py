"""summary.csv: one row per point and step; a point that never ran a step gets one row of its own."""

from __future__ import annotations

import csv
import io
from typing import Any

from planner.report import environment
from planner.report.view import PointView, ReportData
from replay.results import StepResult

STEP_COLUMNS = (
    "load_mode", "load_value", "requests_ok", "requests_failed", "requests_per_s", "output_tokens_per_s",
    "output_tokens_per_s_per_gpu", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p99_ms",
    "e2e_p50_ms", "e2e_p99_ms", "kv_cache_usage_peak", "preemptions", "running_peak", "waiting_peak",
    "slo_pass", "slo_violations", "slo_verdict", "tpot_p99_ms_lo", "tpot_p99_ms_hi", "requests_per_s_lo",
    "requests_per_s_hi", "slo_attainment", "goodput_requests_per_s", "steady_state_dropped",
    # Which server start measured the step ([sweep] server_starts); empty on one start and in a replay.
    "server_start",
)
# vLLM's own view of the step (its histograms over the window) and the client-minus-server check.
SERVER_COLUMNS = (
    "server_ttft_mean_ms", "server_ttft_p99_ms", "server_itl_p50_ms", "server_tpot_mean_ms",
    "server_e2e_mean_ms", "server_queue_mean_ms", "server_queue_p99_ms", "server_prefill_mean_ms",
    "server_decode_mean_ms", "server_requests_finished", "client_requests_finished",
    "client_minus_server_ttft_mean_ms", "client_or_network_latency", "itl_bursts",
    "server_prefix_cache_hit_rate",
)
POINT_COLUMNS = (
    "point_id", "status", "failure_kind", "gpus", "kv_cache_tokens", "max_passing_concurrency",
    "safe_concurrency", "safe_concurrency_per_gpu", "confirmed", "knee_pass", "knee_fail",
    "binding_constraint", "binding_undecided",
    # The knee read from every step (replay.search.pass_fit): pass probability >= 0.9, the band of
    # disagreeing loads, and the loads that both passed and failed (space-separated).
    "knee_fit", "knee_band_lo", "knee_band_hi", "contested_concurrency",
    # The load safe_concurrency was read at: knee_fit, or max_passing in files written before the fit.
    "answer_basis",
    # Each server start's own knee, "start:knee" space-separated ("1:50 2:39 3:51"; "-" where a
    # start passed no load); empty for a point measured on one start.
    "start_knees",
)


def _step_fields(s: StepResult, gpus: int | None) -> dict[str, Any]:
    return {
        "load_mode": s.load.mode,
        "load_value": s.load.value,
        "requests_ok": s.requests_ok,
        "requests_failed": s.requests_failed,
        "requests_per_s": s.requests_per_s,
        "output_tokens_per_s": s.output_tokens_per_s,
        "output_tokens_per_s_per_gpu": None if gpus is None else s.output_tokens_per_s / gpus,
        "ttft_p50_ms": s.ttft_ms.p50,
        "ttft_p99_ms": s.ttft_ms.p99,
        "itl_p50_ms": s.itl_ms.p50,
        "itl_p99_ms": s.itl_ms.p99,
        "tpot_p99_ms": s.tpot_ms.p99,
        "e2e_p50_ms": s.e2e_ms.p50,
        "e2e_p99_ms": s.e2e_ms.p99,
        "kv_cache_usage_peak": s.server.kv_cache_usage_peak,
        "preemptions": s.server.preemptions,
        "running_peak": s.server.running_peak,
        "waiting_peak": s.server.waiting_peak,
        "slo_pass": s.slo_pass,
        "slo_violations": ";".join(s.slo_violations),
        "slo_verdict": s.slo_verdict,
        "tpot_p99_ms_lo": _side(s.tpot_ms.ci95, "p99", 0),
        "tpot_p99_ms_hi": _side(s.tpot_ms.ci95, "p99", 1),
        "requests_per_s_lo": s.requests_per_s_ci95[0] if s.requests_per_s_ci95 else None,
        "requests_per_s_hi": s.requests_per_s_ci95[1] if s.requests_per_s_ci95 else None,
        "slo_attainment": s.slo_attainment,
        "goodput_requests_per_s": s.goodput_requests_per_s,
        "steady_state_dropped": s.steady_state_dropped,
        "server_start": s.server_start,
    }


def _server_fields(s: StepResult) -> dict[str, Any]:
    v = s.server

    def stat(name: str, what: str) -> float | None:
        lat = getattr(v, f"{name}_ms")
        return None if lat is None else getattr(lat, what)

    return {
        "server_ttft_mean_ms": stat("ttft", "mean"),
        "server_ttft_p99_ms": stat("ttft", "p99"),
        "server_itl_p50_ms": stat("itl", "p50"),
        "server_tpot_mean_ms": stat("tpot", "mean"),
        "server_e2e_mean_ms": stat("e2e", "mean"),
        "server_queue_mean_ms": stat("queue", "mean"),
        "server_queue_p99_ms": stat("queue", "p99"),
        "server_prefill_mean_ms": stat("prefill", "mean"),
        "server_decode_mean_ms": stat("decode", "mean"),
        "server_requests_finished": v.requests_finished,
        "client_requests_finished": s.client.requests_finished,
        "client_minus_server_ttft_mean_ms": s.client.ttft_mean_minus_server_ms,
        "client_or_network_latency": s.client.client_or_network_latency,
        "itl_bursts": s.client.itl_bursts,
        "server_prefix_cache_hit_rate": v.prefix_cache_hit_rate,
    }


def _side(ci95: dict | None, stat: str, side: int) -> float | None:
    bounds = (ci95 or {}).get(stat)
    return bounds[side] if bounds else None


def _point_fields(p: PointView) -> dict[str, Any]:
    fitted = p.fit
    return {
        "point_id": p.id,
        "status": p.status,
        "failure_kind": p.failure.kind if p.failure else None,
        "gpus": p.gpus,
        "kv_cache_tokens": p.capacity.kv_cache_tokens,
        "max_passing_concurrency": p.max_passing,
        "safe_concurrency": p.safe,
        "safe_concurrency_per_gpu": p.safe_per_gpu,
        "confirmed": p.confirmed,
        "knee_pass": p.knee_interval[0] if p.knee_interval else None,
        "knee_fail": p.knee_interval[1] if p.knee_interval else None,
        "binding_constraint": p.binding_constraint,
        "binding_undecided": ";".join(p.binding_undecided) or None,
        "knee_fit": fitted.knee_fit,
        "knee_band_lo": fitted.knee_band[0],
        "knee_band_hi": fitted.knee_band[1],
        "contested_concurrency": " ".join(map(str, fitted.contested)) or None,
        "answer_basis": p.answer_basis,
        "start_knees": " ".join(f"{k}:{'-' if v is None else v}" for k, v in (p.start_knees or {}).items()) or None,
    }


def render(data: ReportData) -> str:
    config_columns = [*data.grid_axes, *data.extra_axes] if data.kind == "sweep" else []
    columns = [*POINT_COLUMNS[:1], *config_columns, *POINT_COLUMNS[1:], *STEP_COLUMNS, *SERVER_COLUMNS, *environment.CSV_COLUMNS]
    buf = io.StringIO()
    # Empty cells, not "None", for values that were not measured, so spreadsheets read them as blank.
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for p in data.points:
        base = _point_fields(p) | {k: p.config.get(k) for k in config_columns}
        for s in p.steps or (None,):
            row = base | (_step_fields(s, p.gpus) | _server_fields(s) | environment.csv_fields(s) if s is not None else {})
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return buf.getvalue()
