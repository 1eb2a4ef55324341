"""Where a sweep's points run: the seam between planning the grid (planner.sweep.run) and running
points (planner.sweep.point).

    run_sweep --- Executor.unplaceable(point)   refuse a point no machine here can ever hold
              --- Executor.inventory()           the GPUs points run on, as this machine sees them
              --- Executor.run(ctx, todo)        run every point, filling in its PointResult
              --- Executor.confirm_fresh(...)    the recommended point on a fresh server
              --- Executor.close()

Two implement it: LocalExecutor (planner.sweep.local: waves of points on this machine's GPUs) and
RayExecutor (planner.sweep.ray_driver: one Ray task per point, on the node that holds its GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from planner.capacity import Failure
from planner.gpus import Gpu
from planner.sweep.grid import Point
from planner.sweep.point import PointContext
from planner.sweep.results import FreshServerCheck, PointResult, SweepResults, write_results

# The points an executor runs, each with the result it fills in (the sweep's list holds it).
Todo = list[tuple[Point, PointResult]]


@dataclass
class SweepContext:
    """A running sweep: what its points share, and its results, saved to sweep.json."""

    shared: PointContext
    results: SweepResults

    def save(self) -> None:
        write_results(self.shared.output_dir, self.results)


class Executor(Protocol):
    def unplaceable(self, point: Point) -> Failure | None:
        """Why this executor can never run the point (None when it can)."""
        ...

    def inventory(self) -> list[Gpu]:
        """The GPUs points run on as this machine sees them (none when they run elsewhere)."""
        ...

    async def run(self, ctx: SweepContext, todo: Todo) -> None:
        """Run every point of `todo`, saving `ctx` as results come. A cancel stops them all and
        goes on up, each point marked interrupted."""
        ...

    async def confirm_fresh(self, ctx: SweepContext, point: Point, result: PointResult) -> FreshServerCheck:
        """[sweep] confirm_fresh_server: `point`'s server started again where this executor runs
        points, and its safe concurrency measured once more (planner.sweep.fresh)."""
        ...

    def close(self) -> None: ...
