"""A remote point's live events, carried to the driver's observers (progress display, exporter).

On the node, a RelayObserver stands in for the driver's observers: it records each observer
call, and each snapshot of the point's result, as data (ObserverCall, ResultSnapshot). The executor ships the batches
(planner.sweep.ray_node, through a Ray queue) and the driver replays them with `dispatch`.
Nothing here knows about Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from planner.sweep.observer import SweepObserver, SweepObservers
from planner.sweep.results import PointResult
from replay.records import RequestRecord
from replay.results import LoadSpec, StepResult

# The SweepObserver methods a node relays (point_finished and use_point the driver calls itself).
Relayed = Literal[
    "point_started", "point_placed", "step_started", "request_sent", "request_finished", "step_finished", "probe_planned"
]


@dataclass(frozen=True)
class ObserverCall:
    """One SweepObserver call made on the node, to make again on the driver."""

    method: Relayed
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ResultSnapshot:
    """The point's result as it stood (a copy: the node goes on changing its own)."""

    result: PointResult


Event = ObserverCall | ResultSnapshot


class RelayObserver:
    """A SweepObserver for one point on its node: it records every call as data."""

    def __init__(self) -> None:
        self._events: list[Event] = []

    def point_started(self, point_id: str, config: dict, model: str) -> None:
        self._events.append(ObserverCall("point_started", (point_id, config, model)))

    def point_finished(
        self, point_id: str, safe_concurrency_per_gpu: float | None,
        knee_band_per_gpu: tuple[float | None, float | None] | None = None,
    ) -> None:
        """Not relayed: the driver tells its observers itself once the task's result is in, which
        it knows even when the node is gone."""

    def point_placed(self, point_id: str, node: str, gpu_model: str | None) -> None:
        self._events.append(ObserverCall("point_placed", (point_id, node, gpu_model)))

    def use_point(self, point_id: str) -> None:
        """Not relayed: the driver tells its observers the point of every batch itself."""

    def step_started(self, load: LoadSpec) -> None:
        self._events.append(ObserverCall("step_started", (load,)))

    def request_sent(self) -> None:
        self._events.append(ObserverCall("request_sent", ()))

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None:
        self._events.append(ObserverCall("request_finished", (record,), {"measured": measured}))

    def step_finished(self, step: StepResult) -> None:
        self._events.append(ObserverCall("step_finished", (step,)))

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        self._events.append(ObserverCall("probe_planned", (concurrency, search_eta_s)))

    def result(self, result: PointResult) -> None:
        self._events.append(ResultSnapshot(result.model_copy(deep=True)))

    def take(self) -> list[Event]:
        """The events since the last take, with only the newest result snapshot kept."""
        events, self._events = self._events, []
        last = max((i for i, e in enumerate(events) if isinstance(e, ResultSnapshot)), default=None)
        return [e for i, e in enumerate(events) if not isinstance(e, ResultSnapshot) or i == last]


def dispatch(
    point_id: str, events: Iterable[Event], observers: Iterable[SweepObserver], on_result: Callable[[PointResult], None]
) -> None:
    """Replay one point's events on the driver's observers, each through the SweepObserver method
    it was recorded from. Points run at once on a cluster, so every observer is first told which
    point the calls belong to (`use_point`)."""
    fan = SweepObservers(*observers)
    for event in events:
        if isinstance(event, ResultSnapshot):
            on_result(event.result)
            continue
        fan.use_point(point_id)
        method, args, kwargs = event.method, event.args, event.kwargs
        match method:
            case "point_started":
                fan.point_started(*args)
            case "point_placed":
                fan.point_placed(*args)
            case "step_started":
                fan.step_started(*args)
            case "request_sent":
                fan.request_sent()
            case "request_finished":
                fan.request_finished(*args, **kwargs)
            case "step_finished":
                fan.step_finished(*args)
            case "probe_planned":
                fan.probe_planned(*args)
            case _:
                raise ValueError(f"relayed event {method!r} is no SweepObserver call")
