"""The seam through which a sweep reports its points as they start and finish (the exporter, the
progress bar). A sweep observer is also a replay observer (replay.step.observer), since every point's
steps are replays. Observers are called from the sweep's event loop and must not block.
"""

from __future__ import annotations

from typing import Any, Protocol

from replay.step.observer import Observers, ReplayObserver


class SweepObserver(ReplayObserver, Protocol):
    def point_started(self, point_id: str, config: dict[str, Any], model: str) -> None: ...

    def point_placed(self, point_id: str, node: str, gpu_model: str | None) -> None:
        """A Ray sweep's point started on `node` (its hostname), on GPUs of `gpu_model`."""
        ...

    def use_point(self, point_id: str) -> None:
        """The replay calls that follow belong to this point. Points of a Ray sweep run at once
        and their events reach the driver interleaved, so an observer that keeps per-point state
        is told which point each batch belongs to (planner.sweep.relay.dispatch)."""
        ...

    # knee_band_per_gpu: the knee band read from every step (planner.sweep.outcome.knee_band_per_gpu).
    def point_finished(
        self, point_id: str, safe_concurrency_per_gpu: float | None,
        knee_band_per_gpu: tuple[float | None, float | None] | None = None,
    ) -> None: ...


class SweepObservers(Observers):
    """Fans every call, the sweep's and the replay's, out to several observers."""

    def __init__(self, *observers: SweepObserver) -> None:
        super().__init__(*observers)
        self._points = [o for o in observers if o is not None]

    def point_started(self, point_id: str, config: dict[str, Any], model: str) -> None:
        for o in self._points:
            o.point_started(point_id, config, model)

    def point_placed(self, point_id: str, node: str, gpu_model: str | None) -> None:
        for o in self._points:
            o.point_placed(point_id, node, gpu_model)

    def use_point(self, point_id: str) -> None:
        for o in self._points:
            o.use_point(point_id)

    def point_finished(
        self, point_id: str, safe_concurrency_per_gpu: float | None,
        knee_band_per_gpu: tuple[float | None, float | None] | None = None,
    ) -> None:
        for o in self._points:
            o.point_finished(point_id, safe_concurrency_per_gpu, knee_band_per_gpu)
