"""A pre-flight prediction for every point (planner.estimate), so points that cannot fit by a
clear margin are not launched."""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import ConfigError, EstimateError
from planner.estimate import Estimate, Verdict, estimate_point
from planner.gpus import Gpu
from planner.sweep.config import SweepSettings
from planner.sweep.grid import Point
from planner.sweep.results import NotPredicted
from planner.vllm_args import fixed_flags

MIB = 1 << 20


def predictor(settings: SweepSettings) -> Callable[[Point, list[Gpu]], Estimate | NotPredicted | None]:
    base = fixed_flags(settings.server.args)

    def predict(point: Point, inventory: list[Gpu]) -> Estimate | NotPredicted | None:
        flags = {**base, **{k: v for k, v in point.config.items() if k != "env"}}
        gpu_bytes = None
        if inventory:
            gpu_bytes = min(g.memory_total_mib for g in inventory) * MIB
        elif settings.estimate.gpu_memory_gib is not None:
            gpu_bytes = int(settings.estimate.gpu_memory_gib * (1 << 30))
        try:
            return estimate_point(
                settings.server.model,
                flags,
                device="gpu" if inventory or settings.estimate.gpu or gpu_bytes else "cpu",
                gpu_memory_bytes=gpu_bytes,
                gpu=None if gpu_bytes else settings.estimate.gpu,
            )
        except (EstimateError, ConfigError) as exc:
            return NotPredicted(error=str(exc))

    return predict


def should_skip(verdict: Verdict, *, prune: bool) -> str | None:
    """Why the point is not launched, or None."""
    if prune and verdict.status == "does_not_fit" and verdict.clear_margin:
        largest = verdict.largest_fitting_max_model_len
        hint = f"; the largest max_model_len that fits is {largest}" if largest else ""
        message = verdict.message
        return f"{verdict.reason}{': ' + message if message else ''}{hint}"
    return None
