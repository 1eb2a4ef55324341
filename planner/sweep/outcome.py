"""What a point's end means, what its steps add up to, and which point wins. Pure functions of
results; the executors (planner.sweep.local, planner.sweep.ray_driver) and the point
(planner.sweep.point) apply them."""

from __future__ import annotations

import math

import numpy as np

from planner.capacity import Failure
from planner.sweep.results import INFEASIBLE_KINDS, Best, PointResult, PointStatus
from replay.results import StepResult
from replay.search import binding as binding_mod
from replay.search.pass_fit import DEFAULT_LEVEL, start_knees
from replay.search.verdicts import knee, knee_fields, recommended_load

UPPER_BOUND_CONSTRAINT = "kv_capacity_bound"


def ended_status(failure: Failure) -> PointStatus:
    """A point that ended on `failure`: "infeasible" when the configuration cannot run, else "failed"."""
    return "infeasible" if failure.kind in INFEASIBLE_KINDS else "failed"


def interrupted(message: str = "the sweep was interrupted during this point") -> Failure:
    return Failure(kind="interrupted", message=message)


def conclude(
    result: PointResult,
    lo: int | None,
    hi: int | None,
    *,
    upper: int,
    limit: str | None,
    gpus: int,
    headroom: float,
    gpu_totals_mib: dict[str, float],
    knee_level: float = DEFAULT_LEVEL,
) -> None:
    """Fill in a point whose search ended: lo passed, hi failed (None: none did), `upper` was the
    search's ceiling, set by `limit`; the point holds `gpus` GPUs. The GPU memory headroom is each sampled GPU's total
    (`gpu_totals_mib`, by index) less its peak over the steps."""
    r = result
    r.status = "ok"
    # Said here, not once the sweep ends: the point is saved finished as it is now, and a planner
    # killed before the end leaves it so; --resume reuses it byte for byte.
    r.answer_source = r.answer_source or "searched"
    r.max_passing_concurrency = lo
    r.min_failing_concurrency = hi
    bound_by = binding_mod.binding(r.steps, hi, limit if hi is None and lo == upper else None)
    r.binding_constraint, r.binding_undecided = bound_by.constraint, bound_by.undecided
    r.confirmed, r.knee_interval = knee(r.steps)
    for name, value in knee_fields(r.steps, knee_level).items():
        setattr(r, name, value)
    r.start_knees = start_knees(r.steps, knee_level)
    base, r.answer_basis = recommended_load(lo, r.knee_fit, bool(r.pass_probability), r.start_knees)
    r.safe_concurrency = safe_concurrency(base, headroom)
    r.gpus = gpus
    if r.safe_concurrency is not None:
        r.safe_concurrency_per_gpu = round(r.safe_concurrency / r.gpus, 3)
        tps = output_tokens_per_s_at(r.steps, r.safe_concurrency)
        r.output_tokens_per_s_per_gpu = None if tps is None else round(tps / r.gpus, 2)
    peaks: dict[str, float] = {}
    for step in r.steps:
        for gpu, mib in (step.gpu_memory_peak_mib or {}).items():
            peaks[gpu] = max(peaks.get(gpu, 0.0), mib)
    if peaks:
        r.gpu_memory_peak_mib = peaks
        r.gpu_memory_headroom_mib = {g: gpu_totals_mib[g] - v for g, v in peaks.items() if g in gpu_totals_mib}


def metrics_lost(steps: list[StepResult]) -> tuple[str, list[str]] | None:
    """When the server's /metrics went away (or turned to garbage) after a step had read it: a note
    saying from which step on and why, and the SLOs that could not be checked without it (empty when
    the SLOs need no server metric: then the point's verdict stands). None when nothing was lost."""
    seen = next((i for i, s in enumerate(steps) if s.server.metrics_available), None)
    if seen is None:
        return None
    lost = [s for s in steps[seen + 1 :] if not s.server.metrics_available]
    if not lost:
        return None
    first = lost[0]
    unchecked = sorted({key for s in lost for key in s.slo_unverified})
    note = (
        f"metrics_lost: /metrics gave no vLLM metrics at {len(lost)} of {len(steps)} steps, from the step at"
        f" {first.load.mode} {first.load.value:g} on ({first.server.metrics_note or 'no note'}); their server-side figures are unknown"
    )
    return note, unchecked


def safe_concurrency(base: int | None, headroom: float) -> int | None:
    """floor(base x (1 - headroom)), base being the load the answer was read at
    (replay.search.verdicts.recommended_load)."""
    if base is None:
        return None
    return math.floor(base * (1 - headroom))


def output_tokens_per_s_at(steps: list[StepResult], concurrency: int) -> float | None:
    """Output tokens/s at a concurrency: the measured step when there is one, else linear
    interpolation between the passing closed-loop steps around it (and zero at zero). A disturbed
    step measured something else beside the server: it is left out."""
    points = sorted(
        (int(s.load.value), s.output_tokens_per_s)
        for s in steps
        if s.load.mode == "concurrency" and s.slo_pass and not s.disturbed
    )
    if not points or concurrency < 1:
        return None
    for c, tps in points:
        if c == concurrency:
            return tps
    xs = [0] + [c for c, _ in points]
    ys = [0.0] + [t for _, t in points]
    return float(np.interp(concurrency, xs, ys))


def choose_best(points: list[PointResult]) -> Best | None:
    """Highest safe concurrency per GPU; ties broken by output tokens/s per GPU."""
    candidates = [p for p in points if p.status == "ok" and p.safe_concurrency_per_gpu]
    if not candidates:
        return None

    def key(p: PointResult) -> tuple[float, float]:
        return (p.safe_concurrency_per_gpu or 0.0, p.output_tokens_per_s_per_gpu or 0.0)

    best = max(candidates, key=key)
    others: dict[str, str] = {}
    for p in points:
        if p is best:
            continue
        if p.status in ("dominated", "predicted") and p.answer_note:
            # [sweep] strategy = "adaptive": not searched, and why; whole, since its end names the best
            others[p.id] = p.answer_note
        elif p.status != "ok":
            kind = p.failure.kind if p.failure else p.status
            detail = f" ({p.failure.message})" if p.failure and p.failure.message else ""
            others[p.id] = f"{p.status}: {kind}{detail}"[:300]
        elif not p.safe_concurrency_per_gpu:
            others[p.id] = (
                f"no safe concurrency (bound by {_bound_by(p, 'the SLOs')} already at the lowest load)"
            )
        elif key(p)[0] < key(best)[0]:
            others[p.id] = (
                f"lower safe concurrency per GPU: {p.safe_concurrency_per_gpu:g} vs {best.safe_concurrency_per_gpu:g}"
                f" (bound by {_bound_by(p)})"
            )
        elif key(p) == key(best):
            others[p.id] = "tied on safe concurrency and output tokens/s per GPU; the earlier point is recommended"
        else:
            others[p.id] = (
                f"same safe concurrency per GPU, lower output tokens/s per GPU: "
                f"{p.output_tokens_per_s_per_gpu or 0:.1f} vs {best.output_tokens_per_s_per_gpu or 0:.1f}"
            )
    return Best(
        point_id=best.id,
        safe_concurrency_per_gpu=best.safe_concurrency_per_gpu or 0.0,
        output_tokens_per_s_per_gpu=best.output_tokens_per_s_per_gpu,
        reason=(
            f"highest safe concurrency per GPU ({best.safe_concurrency_per_gpu:g}"
            f" = {best.safe_concurrency} safe / {best.gpus} GPU{'s' if best.gpus != 1 else ''}),"
            f" bound by {_bound_by(best)}"
        ),
        others=others,
    )


def _bound_by(p: PointResult, none: str = "-") -> str:
    return binding_mod.describe(p.binding_constraint, p.binding_undecided, none=none)


def knee_band_per_gpu(result: PointResult) -> tuple[float | None, float | None] | None:
    """The point's knee band (PointResult.knee_band: where its steps agree on a pass, and the
    highest load that passed at all) per GPU; None before the point's search ended."""
    if result.knee_band is None or not result.gpus:
        return None
    lo, hi = result.knee_band
    return tuple(None if v is None else round(v / result.gpus, 3) for v in (lo, hi))  # type: ignore[return-value]
