"""The recommended point's answer, measured once more on a fresh server.

A point's search runs every step against one server start. An answer that depends on that start
(a warm cache, a fragmented KV pool, a server that slowed over the search) would not hold on the
next start. So, once the sweep has chosen, the recommended point's server is started again and
one step is measured at the recommended (safe) concurrency. A disturbed step is measured again,
up to [replay] disturbed_retries times, like any other.

It holds when that step passes. When it does not, the point is searched again on that fresh
server's successor (a new start, the whole search), and the results keep both answers: the
recommendation is not changed, and the report shows the two side by side.

On by default: [sweep] confirm_fresh_server. Each executor runs it where it runs points: the
local one on this machine, Ray's as a task on a node that can hold the point
(planner.sweep.ray_node.fresh_on_node). A point across nodes is not confirmed, and a note says so.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from planner.sweep.grid import Point
from planner.sweep.point import PointContext, Save, now, point_server, run_point
from planner.sweep.results import FreshServerCheck, PointResult
from replay.client.streaming import METRICS_CONNECTIONS
from replay.load.kinds import Concurrency
from replay.run.runner import Replay
from replay.step.environment import CpuProbe, WindowProbe

LOG_FILE = "fresh-server.log"


def fresh_log_path(point_id: str) -> Path:
    return Path("points") / point_id / LOG_FILE


async def confirm_on_fresh_server(
    ctx: PointContext, point: Point, result: PointResult, *, save: Save
) -> FreshServerCheck:
    """Restart `point`'s server on the GPUs it ran on and measure its safe concurrency once more."""
    concurrency = result.safe_concurrency
    check = FreshServerCheck(point_id=result.id, concurrency=concurrency or 0, started_at=now())
    if not concurrency:
        check.note = "the point has no safe concurrency to confirm"
        return check
    settings = ctx.settings
    server = point_server(
        settings, point, log_path=ctx.output_dir / fresh_log_path(point.id), gpu_ids=tuple(result.gpu_ids),
        port=settings.server.port or None, cpus=ctx.cpus,
    )
    check.log_path = str(fresh_log_path(point.id))

    def server_pids() -> set[int]:
        return {server.pid} if server.pid is not None else set()

    def probes() -> list[WindowProbe]:
        split = ctx.cpus
        return [CpuProbe(
            server_pids,
            server_cpus=split.server if split is not None else None,
            planner_cpus=split.client if split is not None else None,
        )]

    async with server:
        api_key = settings.server.api_key.get_secret_value() if settings.server.api_key else None
        async with settings.replay.client(
            server.url, model=None, api_key=api_key, max_connections=concurrency + METRICS_CONNECTIONS
        ) as client:
            await client.check()
            # The point's steps size the closed loop's ramp-up (one request duration at the nearest load).
            replay = Replay(
                client, ctx.corpus, settings.replay, settings.slo.rules(), probes=probes, known_steps=result.steps,
                prompt_tokens=ctx.prompt_tokens,
            )
            for _ in range(settings.replay.disturbed_retries + 1):
                step = await replay.step(Concurrency(concurrency))
                check.steps.append(step)
                save()
                if not step.disturbed:
                    break
    last = check.steps[-1]
    if last.disturbed:
        check.note = "every step on the fresh server was disturbed: " + "; ".join(last.disturbed)
        return check
    check.held = last.slo_pass
    if not check.held:
        again = PointResult(
            id=f"{result.id}-fresh", config=result.config, command=[], status="pending", fingerprint=result.fingerprint,
            gpus=result.gpus,
        )
        check.searched_again = again
        # Its own id, so that its log and its steps stand beside the first search's.
        await run_point(ctx, replace(point, id=again.id), again, tuple(result.gpu_ids), save=save)
    return check


def summary(check: FreshServerCheck) -> str:
    """One line for the end of a sweep and for the report."""
    if check.held is None:
        return f"fresh-server confirmation of {check.point_id}: not measured ({check.note or 'no step'})"
    step = check.steps[-1]
    measured = f"{check.concurrency} in flight on a fresh server"
    if check.held:
        return f"fresh-server confirmation of {check.point_id}: held ({measured} passed again)"
    failed = ", ".join(step.slo_violations) or "the SLOs"
    again = check.searched_again
    found = (
        f"searched again on a new start: max passing {again.max_passing_concurrency}, safe {again.safe_concurrency}"
        if again is not None and again.status == "ok"
        else f"searched again on a new start: {again.status if again is not None else 'not run'}"
    )
    return f"fresh-server confirmation of {check.point_id}: did NOT hold ({measured} failed {failed}); {found}"
