"""Fleet sizing: how many replicas (and GPUs) carry a target load at each point's safe concurrency.

A replica serves `safe_concurrency` requests at once. For a target concurrency C the fleet needs
ceil(C / safe_concurrency) replicas. For a target rate R it needs ceil(R / rps_safe), where
rps_safe is the request rate one replica sustains at its safe concurrency: requests_per_s
interpolated linearly between the two measured concurrency steps around it (their mean where a
concurrency was measured twice). Below the lowest measured step the rate is scaled down along
the line through the origin, since at light load latency is flat and throughput grows in
proportion to concurrency. The cheapest option is the one with the fewest GPUs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import ConfigError
from planner.report.view import PointView
from replay.results import StepResult

# Rounding noise in a ratio must not add a replica (10.0000000001 -> 11).
_EPS = 1e-9


@dataclass(frozen=True)
class RateEstimate:
    requests_per_s: float
    # How it was obtained, for the report ("measured at 16", "interpolated between 16 and 24", ...).
    method: str


@dataclass(frozen=True)
class FleetOption:
    point_id: str
    safe_concurrency: int
    gpus_per_replica: int | None
    requests_per_s_per_replica: RateEstimate | None
    replicas: int
    gpus: int | None


@dataclass(frozen=True)
class FleetPlan:
    target_rps: float | None
    target_concurrency: int | None
    options: tuple[FleetOption, ...]
    cheapest: FleetOption | None
    # Feasible points that could not be sized, and why.
    unsized: dict[str, str]


def requests_per_s_at(steps: Sequence[StepResult], concurrency: float) -> RateEstimate | None:
    """The request rate at `concurrency`, from concurrency-mode steps; None without any."""
    by_concurrency: dict[float, list[float]] = defaultdict(list)
    for s in steps:
        if s.load.mode == "concurrency" and s.requests_ok > 0:
            by_concurrency[s.load.value].append(s.requests_per_s)
    if not by_concurrency:
        return None
    xs = sorted(by_concurrency)
    ys = [sum(by_concurrency[x]) / len(by_concurrency[x]) for x in xs]
    if concurrency in by_concurrency:
        return RateEstimate(ys[xs.index(concurrency)], f"measured at {_num(concurrency)}")
    if concurrency < xs[0]:
        return RateEstimate(ys[0] * concurrency / xs[0], f"scaled from {_num(xs[0])} through the origin")
    if concurrency > xs[-1]:
        # Throughput does not fall with load below the knee, so the last step is a lower bound.
        return RateEstimate(ys[-1], f"held at the highest measured step ({_num(xs[-1])})")
    hi = next(i for i, x in enumerate(xs) if x > concurrency)
    x0, x1, y0, y1 = xs[hi - 1], xs[hi], ys[hi - 1], ys[hi]
    rate = y0 + (y1 - y0) * (concurrency - x0) / (x1 - x0)
    return RateEstimate(rate, f"interpolated between {_num(x0)} and {_num(x1)}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _replicas(target: float, per_replica: float) -> int:
    return max(1, math.ceil(target / per_replica - _EPS))


def check_targets(target_rps: float | None, target_concurrency: int | None) -> None:
    if target_rps is not None and not (math.isfinite(target_rps) and target_rps > 0):
        raise ConfigError(f"--target-rps {target_rps!r}: must be a positive number of requests per second")
    if target_concurrency is not None and target_concurrency < 1:
        raise ConfigError(f"--target-concurrency {target_concurrency!r}: must be a whole number >= 1")


def plan_fleet(
    points: Sequence[PointView],
    *,
    target_rps: float | None = None,
    target_concurrency: int | None = None,
) -> FleetPlan:
    """Size a fleet for every feasible point. With both targets, each option meets both."""
    check_targets(target_rps, target_concurrency)
    if target_rps is None and target_concurrency is None:
        raise ConfigError("fleet sizing needs --target-rps or --target-concurrency")
    options: list[FleetOption] = []
    unsized: dict[str, str] = {}
    for p in points:
        if not p.feasible or p.safe is None:
            continue
        replicas = 0
        rate = requests_per_s_at(p.steps, p.safe)
        if target_rps is not None:
            if rate is None or rate.requests_per_s <= 0:
                unsized[p.id] = "no concurrency step measured a request rate"
                continue
            replicas = _replicas(target_rps, rate.requests_per_s)
        if target_concurrency is not None:
            replicas = max(replicas, _replicas(target_concurrency, p.safe))
        gpus = None if p.gpus is None else replicas * p.gpus
        options.append(FleetOption(p.id, p.safe, p.gpus, rate, replicas, gpus))
    cheapest = min(
        options,
        key=lambda o: (
            o.gpus if o.gpus is not None else math.inf,
            o.replicas,
            -(o.requests_per_s_per_replica.requests_per_s if o.requests_per_s_per_replica else 0.0),
            o.point_id,
        ),
        default=None,
    )
    return FleetPlan(target_rps, target_concurrency, tuple(options), cheapest, unsized)
