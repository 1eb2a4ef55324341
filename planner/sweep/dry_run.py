"""What `planner sweep --dry-run` says of the grid's speed classes and each point's upper bound,
and, under [sweep] strategy = "adaptive", the order the points will run in (planner.sweep.adaptive).

A point's bound before it starts is the estimate's KV pool (planner.estimate) over the corpus's
mean request, counted roughly (planner.sweep.duration), capped by max_num_seqs and [replay]
max_concurrency; without an estimate it is read from the server at start-up. An estimated bound
orders points; it never settles one (planner.sweep.adaptive says why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.estimate import Estimate
from planner.sweep.adaptive import launch_order, max_num_seqs_of
from planner.sweep.classes import class_of, speed_classes
from planner.sweep.config import SweepSettings
from planner.sweep.duration import Expected, total_lines
from planner.sweep.grid import Point
from planner.sweep.results import PointResult


def estimated_bound(
    point: Point, settings: SweepSettings, prediction: object, mean_request_tokens: float | None
) -> tuple[int | None, str]:
    """The point's upper bound on concurrency before it starts, and where it comes from."""
    caps = [(n, v) for n, v in (("max_num_seqs", max_num_seqs_of(point, settings)),
                                ("[replay] max_concurrency", settings.replay.max_concurrency)) if v is not None]
    if isinstance(prediction, Estimate) and max_num_seqs_of(point, settings) is None and prediction.settings.max_num_seqs:
        # vLLM's own default for the point, as the estimate reads it.
        caps.append(("max_num_seqs (vLLM's default)", prediction.settings.max_num_seqs))
    if isinstance(prediction, Estimate) and prediction.kv_cache_tokens and mean_request_tokens:
        bound, source = max(1, int(prediction.kv_cache_tokens / mean_request_tokens)), "the estimate's KV pool over the corpus"
        for name, value in caps:
            if value < bound:
                bound, source = value, name
        return bound, source
    if caps:
        name, value = min(caps, key=lambda c: c[1])
        return value, f"{name}; the KV pool is read from the server at start-up"
    return None, "read from the server at start-up (give --request-duration-s for the estimate's)"


def class_lines(
    settings: SweepSettings,
    points: Sequence[Point],
    predictions: Mapping[str, object],
    mean_request_tokens: float | None,
    expected_by_point: Mapping[str, Expected] | None = None,
) -> list[str]:
    """The classes, each point's bound in launch order, and the expected total of the plan
    (planner.sweep.duration.total_lines) when each point's expected duration is given."""
    memory = settings.sweep.memory_only_flags
    classes = speed_classes(points, memory)
    by_point = class_of(points, memory)
    lines = [f"speed classes: {len(classes)} (points that differ only in [sweep] memory_only_flags: {', '.join(memory) or 'none'})"]
    lines += [f"  {c.id}: {c.label()}: {len(c.point_ids)} point{'s' if len(c.point_ids) != 1 else ''}" for c in classes]
    ordered = list(points)
    if settings.sweep.strategy == "adaptive":
        if settings.sweep.verify_predictions == "all":
            lines.append(
                "strategy: adaptive, verify_predictions = all: highest bound per GPU first; the first point of each"
                " class is searched in full, and every other point is started and its prediction verified by"
                " measurement, none skipped (a check of the speed-class assumption)"
            )
        else:
            lines.append(
                "strategy: adaptive: highest bound per GPU first; the first point of each class is searched in full, the"
                " others are predicted from its law, verified when they could win, and skipped (dominated, predicted)"
                " when they cannot beat the best confirmed point"
            )
        todo = []
        for p in points:
            r = PointResult(id=p.id, config=p.config, command=[], status="pending", fingerprint="")
            prediction = predictions.get(p.id)
            if isinstance(prediction, Estimate):
                r.kv_cache_tokens_predicted = prediction.kv_cache_tokens
            todo.append((p, r))
        ordered = [p for p, _ in launch_order(todo, settings, mean_request_tokens)]
        lines.append("plan, in launch order:")
    else:
        lines.append("strategy: exhaustive: every point is searched in full, in grid order ([sweep] strategy)")
    for p in ordered:
        bound, source = estimated_bound(p, settings, predictions.get(p.id), mean_request_tokens)
        shown = "unknown before start-up" if bound is None else f"~{bound} ({bound / p.gpus:g} per GPU)"
        lines.append(f"  {p.id}: class {by_point[p.id].id}, upper bound {shown}: {source}")
    if expected_by_point:
        first_by_class: dict[str, str] = {}
        for p in ordered:
            first_by_class.setdefault(by_point[p.id].id, p.id)
        lines += total_lines(
            dict(expected_by_point), {p.id: by_point[p.id].id for p in points}, first_by_class, settings.sweep.strategy
        )
    return lines
