"""Sweeps on this machine: points run in waves, each point on GPUs of its own
(planner.gpus.plan_placement), a wave's points at the same time."""

from __future__ import annotations

import asyncio

from planner import gpus as gpu_mod
from planner.capacity import Failure
from planner.sweep.config import SweepSettings
from planner.sweep.executor import SweepContext, Todo
from planner.sweep.fresh import confirm_on_fresh_server
from planner.sweep.grid import Point
from planner.sweep.point import record_prediction_error, run_point
from planner.sweep.results import FreshServerCheck, PointResult


class LocalExecutor:
    def __init__(self, settings: SweepSettings) -> None:
        self.settings = settings
        self._inventory: list[gpu_mod.Gpu] | None = None

    def inventory(self) -> list[gpu_mod.Gpu]:
        if self._inventory is None:
            self._inventory = gpu_mod.discover(self.settings.gpus.devices)
        return self._inventory

    def unplaceable(self, point: Point) -> Failure | None:
        if point.nnodes > 1:
            return Failure(
                kind="not_enough_gpus",
                message=f"the point spreads vLLM over {point.nnodes} nodes (nnodes = {point.nnodes}) and a local sweep"
                " has one machine; run it on a Ray cluster ([executor] kind = \"ray\", or --executor ray)",
            )
        inventory = self.inventory()
        if inventory and point.gpus > len(inventory):
            return Failure(
                kind="world_size_too_large",
                message=f"the point needs {point.gpus} GPUs (tensor x pipeline parallel) but {len(inventory)} are"
                " available",
            )
        return None

    async def confirm_fresh(self, ctx: SweepContext, point: Point, result: PointResult) -> FreshServerCheck:
        return await confirm_on_fresh_server(ctx.shared, point, result, save=ctx.save)

    async def run(self, ctx: SweepContext, todo: Todo) -> None:
        waves = gpu_mod.plan_placement([p.gpus for p, _ in todo], [g.index for g in self.inventory()])
        if self.settings.server.port:
            # One fixed port (a container's published port, say) carries one server at a time.
            waves = [[placement] for wave in waves for placement in wave]
        for wave in waves:
            await asyncio.gather(
                *(run_point(ctx.shared, *todo[pl.point], pl.gpu_ids, save=ctx.save) for pl in wave)
            )
            for _, result in (todo[pl.point] for pl in wave):
                record_prediction_error(result)

    def close(self) -> None:
        pass
