"""One shape for what a report shows, whether it came from a sweep or from a single replay.

A replay is one server and no grid: it becomes a single point whose GPU count is unknown
(replay.json does not record it) and whose safe concurrency is the load its answer was read at
(the knee read from every step), since a replay keeps no headroom of its own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from planner.capacity import Capacity, Failure
from planner.cost import Prices
from planner.report.answers import answers_section
from planner.sweep import fresh
from planner.sweep.results import KneePrediction, NodeRank, PointResult, SpeedClassInfo, SweepResults
from replay.results import ReplayResults, StepResult
from replay.search import binding as binding_mod
from replay.search import pass_fit
from replay.search.policy import bracket
from replay.search.verdicts import concurrency_history, recommended_load

LOAD_AXIS_LABELS = {
    "concurrency": "Concurrency (requests in flight)",
    "rate": "Offered load (requests/s)",
    "trace": "Trace speed-up (x)",
}

# The grid axes every sweep has; other config keys are shown as "other flags".
GRID_AXES = ("max_model_len", "gpu_memory_utilization", "tensor_parallel_size")


@dataclass(frozen=True)
class PointView:
    id: str
    config: dict[str, Any]
    status: str
    # None for a replay: the number of GPUs behind the URL is not recorded.
    gpus: int | None
    # Sorted along the load axis (then by start time) so curves are drawn left to right.
    steps: tuple[StepResult, ...]
    max_passing: int | None
    min_failing: int | None
    safe: int | None
    binding_constraint: str | None
    # Rules undecided at the lowest failing step (replay.search.binding): listed apart, they did
    # not bind.
    binding_undecided: tuple[str, ...] = ()
    # Concurrencies whose every step was disturbed, and whether interference was allowed.
    disturbed_concurrency: tuple[int, ...] = ()
    interference_allowed: bool = False
    output_tokens_per_s_per_gpu: float | None = None
    capacity: Capacity = field(default_factory=Capacity)
    failure: Failure | None = None
    kv_cache_tokens_predicted: int | None = None
    kv_cache_tokens_relative_error: float | None = None
    command: tuple[str, ...] = ()
    # The GPUs' model the point ran on, when recorded (a cluster may mix models).
    gpu_model: str | None = None
    confirmed: bool | None = None
    knee_interval: tuple[int | None, int | None] | None = None
    # A point vLLM spread over nodes: where each rank ran (rank 0 first); empty on one node.
    ranks: tuple[NodeRank, ...] = ()
    # The knee read from every step (replay.search.pass_fit) at its pass-probability level, and the
    # load the answer was read at: "knee_fit", "start_majority" (several server starts, each
    # start's own knee in start_knees), or "max_passing" for files written before the fit.
    knee_fit: int | None = None
    knee_fit_level: float | None = None
    answer_basis: str | None = None
    start_knees: dict[int, int | None] | None = None

    @property
    def load_mode(self) -> str:
        return self.steps[0].load.mode if self.steps else "concurrency"

    @property
    def feasible(self) -> bool:
        return self.status == "ok" and self.safe is not None and self.safe > 0

    @property
    def safe_per_gpu(self) -> float | None:
        if self.safe is None or self.gpus is None:
            return None
        return self.safe / self.gpus

    @functools.cached_property
    def fit(self) -> pass_fit.KneeFit:
        """The knee read from every step (replay.search.pass_fit) at the point's level, computed
        once for the report's text, table and plot."""
        return pass_fit.fit(self.steps, self.knee_fit_level)

    @property
    def answer_load(self) -> int | None:
        """The load the answer was read at: knee_fit, the start majority, or max passing in files
        written before the fit."""
        if self.answer_basis == "start_majority" and self.start_knees:
            return pass_fit.majority_knee(list(self.start_knees.values()))
        return self.knee_fit if self.answer_basis == "knee_fit" else self.max_passing

    @property
    def headroom(self) -> float | None:
        """The fraction of the answer's load left unused at the safe point."""
        if self.safe is None or not self.answer_load:
            return None
        return 1.0 - self.safe / self.answer_load

    def bound_by(self, none: str = "-") -> str:
        """The binding constraint, with the rules undecided there listed apart."""
        return binding_mod.describe(self.binding_constraint, self.binding_undecided, none=none)

    def config_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config.items()) or "(as launched)"


@dataclass(frozen=True)
class ReportData:
    kind: Literal["sweep", "replay"]
    source: Path
    model: str | None
    slo: dict[str, float]
    points: tuple[PointView, ...]
    best_id: str | None = None
    best_reason: str | None = None
    # Why every other point lost, keyed by point id (sweeps only).
    others: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False
    started_at: str | None = None
    url: str | None = None
    # The sweep's configured headroom fraction (its [slo] headroom), when saved.
    headroom_setting: float | None = None
    # The recommended point measured again on a fresh server (planner.sweep.fresh), in one line.
    fresh_server: str | None = None
    # The adaptive strategy's account (planner.report.answers), as markdown lines; empty otherwise.
    answers: tuple[str, ...] = ()
    # Its speed classes (each law plotted, planner.report.law_plots) and every prediction, by point.
    speed_classes: tuple[SpeedClassInfo, ...] = ()
    predictions: tuple[tuple[str, KneePrediction], ...] = ()
    # GPU prices from --gpu-hour-price and the sweep's [cost] gpu_hour (planner.cost); none by default.
    prices: Prices = field(default_factory=Prices)

    @property
    def best(self) -> PointView | None:
        return next((p for p in self.points if p.id == self.best_id), None)

    @property
    def grid_axes(self) -> list[str]:
        """The standard grid axes some point actually sets (a grid may vary only one of them)."""
        return [k for k in GRID_AXES if any(k in p.config for p in self.points)]

    @property
    def extra_axes(self) -> list[str]:
        """Config keys beyond the standard grid axes, in first-seen order."""
        keys: dict[str, None] = {}
        for p in self.points:
            for k in p.config:
                if k not in GRID_AXES:
                    keys[k] = None
        return list(keys)


def _sorted_steps(steps: list[StepResult]) -> tuple[StepResult, ...]:
    return tuple(sorted(steps, key=lambda s: (s.load.value, s.started_at)))


def _point(p: PointResult) -> PointView:
    return PointView(
        id=p.id,
        config=dict(p.config),
        status=p.status,
        gpus=p.gpus,
        steps=_sorted_steps(p.steps),
        max_passing=p.max_passing_concurrency,
        min_failing=p.min_failing_concurrency,
        safe=p.safe_concurrency,
        binding_constraint=p.binding_constraint,
        binding_undecided=tuple(p.binding_undecided),
        disturbed_concurrency=tuple(p.disturbed_concurrency),
        interference_allowed=p.interference_allowed,
        output_tokens_per_s_per_gpu=p.output_tokens_per_s_per_gpu,
        capacity=p.capacity,
        failure=p.failure,
        kv_cache_tokens_predicted=p.kv_cache_tokens_predicted,
        kv_cache_tokens_relative_error=p.kv_cache_tokens_relative_error,
        command=tuple(p.command),
        gpu_model=p.gpu_model,
        confirmed=p.confirmed,
        knee_interval=tuple(p.knee_interval) if p.knee_interval else None,
        ranks=tuple(p.ranks),
        knee_fit=p.knee_fit,
        knee_fit_level=p.knee_fit_level,
        answer_basis=p.answer_basis or ("max_passing" if p.safe_concurrency is not None else None),
        start_knees=p.start_knees,
    )


def from_sweep(source: Path, sweep: SweepResults) -> ReportData:
    return ReportData(
        kind="sweep",
        source=source,
        model=sweep.settings.server.model or None,
        slo=sweep.settings.slo.bounds(),
        points=tuple(_point(p) for p in sweep.points),
        best_id=sweep.best.point_id if sweep.best else None,
        best_reason=sweep.best.reason if sweep.best else None,
        others=dict(sweep.best.others) if sweep.best else {},
        interrupted=sweep.interrupted,
        started_at=sweep.started_at,
        headroom_setting=sweep.settings.slo.headroom,
        fresh_server=fresh.summary(sweep.fresh_server) if sweep.fresh_server is not None else None,
        answers=tuple(answers_section(sweep)),
        speed_classes=tuple(c for c in sweep.speed_classes if c.law is not None),
        predictions=tuple((p.id, p.knee_prediction) for p in sweep.points if p.knee_prediction is not None),
    )


def from_replay(source: Path, replay: ReplayResults) -> ReportData:
    max_passing, min_failing = replay.max_passing_concurrency, replay.min_failing_concurrency
    concurrency_steps = [s for s in replay.steps if s.load.mode == "concurrency"]
    if max_passing is None and min_failing is None and concurrency_steps:
        # A fixed list of loads (no --find-max) still brackets the answer.
        b = bracket(concurrency_history(concurrency_steps))
        max_passing, min_failing = b.max_passing, b.min_failing
    binding, undecided = replay.binding_constraint, list(replay.binding_undecided)
    if binding is None and not undecided and min_failing is not None:
        # A fixed list of loads: bound by what its lowest failing step broke conclusively.
        bound_by = binding_mod.binding(concurrency_steps, min_failing, None)
        binding, undecided = bound_by.constraint, bound_by.undecided
    # A replay keeps no headroom: its answer is the load it was read at, from every step when the
    # steps can be fitted (fixed loads too), as a sweep's is.
    fitted = pass_fit.fit(replay.steps, replay.knee_fit_level)
    answer, basis = recommended_load(max_passing, fitted.knee_fit, bool(fitted.points))
    point = PointView(
        id="replay",
        config={},
        status="ok" if answer else "infeasible",
        gpus=None,
        steps=_sorted_steps(replay.steps),
        max_passing=max_passing,
        min_failing=min_failing,
        safe=answer,
        binding_constraint=binding,
        binding_undecided=tuple(undecided),
        disturbed_concurrency=tuple(replay.disturbed_concurrency),
        interference_allowed=replay.interference_allowed,
        confirmed=replay.confirmed,
        knee_interval=tuple(replay.knee_interval) if replay.knee_interval else None,
        knee_fit=fitted.knee_fit,
        knee_fit_level=fitted.level,
        answer_basis=basis,
    )
    return ReportData(
        kind="replay",
        source=source,
        model=replay.model,
        slo=dict(replay.slo),
        points=(point,),
        best_id=point.id if point.feasible else None,
        interrupted=replay.interrupted,
        started_at=replay.started_at,
        url=replay.url,
    )


def build(source: Path, results: SweepResults | ReplayResults) -> ReportData:
    if isinstance(results, SweepResults):
        return from_sweep(source, results)
    return from_replay(source, results)
