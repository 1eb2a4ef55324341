"""Sweeps on a Ray cluster, the node's side: one point, run as a Ray task on the node that holds
its GPUs, exactly as a local sweep runs it (planner.sweep.point.run_point). Its saves and its
observers' events go to the driver (planner.sweep.ray_driver) through a Ray queue; the task returns
a NodeResult. A point across nodes is rank 0 here, with its other ranks as actors
(planner.sweep.ray_ranks). The recommended point's fresh-server confirmation runs the same way
(fresh_on_node), on a node that can hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.exceptions import RayError
from ray.util.queue import Queue

from planner.capacity import Failure
from planner.errors import PeerLost, PeerStartFailed
from planner.ports import free_port
from planner.sweep.config import SweepSettings
from planner.sweep.fresh import confirm_on_fresh_server
from planner.sweep.grid import Point
from planner.sweep.outcome import ended_status
from planner.sweep.point import PORT_ATTEMPTS, PointContext, Save, run_point
from planner.sweep.ray_ranks import HeadlessRanks, accelerator_type, local_gpus, rank_flags, rank_log_path
from planner.sweep.relay import RelayObserver
from planner.sweep.results import FreshServerCheck, NodeRank, PointResult
from planner.vllm_log import log_tail
from replay.corpus.jsonl import Corpus

# How often a node sends its point's events to the driver.
RELAY_EVERY_S = 0.25
# Rank 0's failures that say only that it stopped, not why (another rank may know).
_WENT_DOWN_WITH_ANOTHER = frozenset({"interrupted", "server_died", "crashed", "timeout", "replay_error"})


@dataclass
class NodeResult:
    """What a point's task returns to the driver: its result and its servers' logs (the node's
    working folder is gone by then)."""

    result: PointResult
    # Rank 0's log (the point's only one on one node); None when it wrote none.
    server_log: bytes | None = None
    # The headless ranks' logs, by rank (a point across nodes).
    rank_logs: dict[int, bytes] = field(default_factory=dict)


async def _send(relay: Queue, point_id: str, observer: RelayObserver) -> None:
    events = observer.take()
    if events:
        try:
            await relay.put_async((point_id, events))
        except RayError:
            pass  # the driver is gone; the point's result still travels back as the task's return value


async def _on_node(settings: SweepSettings, corpus: Corpus, point: Point, result: PointResult, relay: Queue) -> NodeResult:
    runtime = ray.get_runtime_context()
    gpu_ids = tuple(str(g) for g in runtime.get_accelerator_ids().get("GPU", []))
    workdir = Path(tempfile.mkdtemp(prefix=f"planner-point-{point.id}-"))
    observer = RelayObserver()
    # A retried point starts over: nothing of the attempt its node took down is kept.
    result = PointResult.model_validate(
        {
            **result.model_dump(),
            "steps": [],
            "ranks": [],
            "node_id": runtime.get_node_id(),
            "node_hostname": socket.gethostname(),
        }
    )
    inventory = local_gpus(gpu_ids)
    result.gpu_model = ", ".join(sorted({g.name for g in inventory})) or accelerator_type(result.node_id)
    ctx = PointContext(settings=settings, corpus=corpus, output_dir=workdir, observers=[observer], gpu_inventory=inventory)

    def save() -> None:
        # The driver owns sweep.json: saving sends it the result.
        observer.result(result)

    observer.point_placed(point.id, result.node_hostname, result.gpu_model)

    async def pump() -> None:
        while True:
            await asyncio.sleep(RELAY_EVERY_S)
            await _send(relay, point.id, observer)

    pumping = asyncio.create_task(pump())
    out = NodeResult(result)
    try:
        if point.nnodes == 1:
            await run_point(ctx, point, result, gpu_ids, save=save)
        else:
            out.rank_logs = await _across_nodes(ctx, point, result, gpu_ids, save)
        log = workdir / (result.log_path or "")
        out.server_log = log.read_bytes() if result.log_path and log.is_file() else None
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
        await _send(relay, point.id, observer)
        shutil.rmtree(workdir, ignore_errors=True)
    return out


async def _across_nodes(
    ctx: PointContext, point: Point, result: PointResult, gpu_ids: tuple[str, ...], save: Save
) -> dict[int, bytes]:
    """Rank 0 of a point vLLM spreads over nodes, and its other ranks. The master port is chosen
    free, but another process can take it before rank 0 listens on it (torch's EADDRINUSE): then
    every rank is started again on a port chosen afresh, up to PORT_ATTEMPTS starts in all."""
    master_addr = ray.util.get_node_ip_address()
    attempt = 0
    while True:
        attempt += 1
        master_port = free_port(master_addr)
        logs = await _ranks(ctx, point, result, gpu_ids, save, master_addr, master_port)
        if result.failure is None or result.failure.kind != "master_port_taken" or attempt == PORT_ATTEMPTS:
            return logs
        result.notes.append(
            f"master_port_taken: another process held torch.distributed's master port {master_port} on"
            f" {result.node_hostname} when rank 0 listened on it; every rank started again on another port"
        )
        result.status, result.failure, result.ranks = "running", None, []
        save()


async def _ranks(
    ctx: PointContext,
    point: Point,
    result: PointResult,
    gpu_ids: tuple[str, ...],
    save: Save,
    master_addr: str,
    master_port: int,
) -> dict[int, bytes]:
    """One start of the point's ranks: the headless ones first (they wait for rank 0), then the
    point as on one node. A headless rank whose vLLM exits ends the point; one whose node is lost
    reruns it (PeerLost)."""
    peers = HeadlessRanks(ctx.settings, point, master_addr, master_port)
    rank0 = NodeRank(
        rank=0,
        node_id=result.node_id,
        node_hostname=result.node_hostname,
        gpu_ids=list(gpu_ids),
        gpu_model=result.gpu_model,
        log_path=result.log_path,
    )
    try:
        try:
            others = await peers.start()
        except PeerStartFailed as exc:
            result.status, result.failure = "failed", Failure(kind="crashed", message=str(exc))
            return {}
        result.ranks = [rank0, *others]
        for r in others:
            r.log_path = rank_log_path(point.id, r.rank)
        result.gpu_model = _models(result.ranks)
        save()
        as_rank0 = dataclasses.replace(point, flags=[*point.flags, *rank_flags(0, master_addr, master_port)])
        not_ready = result.capacity  # replaced by the server's own once rank 0 is ready
        measuring = asyncio.create_task(run_point(ctx, as_rank0, result, gpu_ids, save=save))
        watching = asyncio.create_task(peers.first_exit())
        await asyncio.wait({measuring, watching}, return_when=asyncio.FIRST_COMPLETED)
        ready = result.capacity is not not_ready
        ended = None
        if not measuring.done():
            # Another rank ended first (vLLM's ranks never end because rank 0 did): the engine is
            # broken, so rank 0 stops measuring now rather than time requests against it.
            ended = watching.result()
            measuring.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await measuring
        elif watching.done():
            ended = watching.result()
        else:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            if _went_down(result):
                # Rank 0 failed without saying why: whether another rank went first, ask them.
                ended = await peers.check()
        if not measuring.cancelled():
            measuring.result()  # a bug of the planner's goes on up
        if ended is None:
            return peers.logs
        rank, exit_code, lost = ended
        if lost is not None:
            raise PeerLost(f"rank {rank.rank} on {rank.node_hostname}: {lost}", log_tail(_read(ctx, result.log_path)))
        if _went_down(result):
            # The rank that ended first has the cause in its log; what rank 0 then did follows.
            own = result.failure
            await peers.stop()
            failure = peers.failure(rank, exit_code, ready=ready)
            if own is not None and own.kind != "interrupted":
                failure.message += f"; then rank 0: {own.message}"
            result.status = ended_status(failure)
            result.failure = failure
        return peers.logs
    finally:
        await peers.stop()
        rank0.log_path = result.log_path
        if result.ranks:
            # Every node's model (the point's run set rank 0's alone).
            result.gpu_model = _models(result.ranks)
        save()


def _read(ctx: PointContext, relative: str | None) -> str:
    path = ctx.output_dir / (relative or "")
    return path.read_text(errors="replace") if relative and path.is_file() else ""


def _went_down(result: PointResult) -> bool:
    return result.status != "ok" and (result.failure is None or result.failure.kind in _WENT_DOWN_WITH_ANOTHER)


def _models(ranks: list[NodeRank]) -> str | None:
    return ", ".join(sorted({r.gpu_model for r in ranks if r.gpu_model})) or None


@dataclass
class FreshResult:
    """What a fresh-server confirmation's task returns: the check, and its servers' logs by their
    path in the output folder (the node's working folder is gone by then)."""

    check: FreshServerCheck
    logs: dict[str, bytes] = field(default_factory=dict)


async def _fresh_on_node(settings: SweepSettings, corpus: Corpus, point: Point, result: PointResult) -> FreshResult:
    """The recommended point's server started again on this node, on the GPUs Ray gave the task,
    and its safe concurrency measured once more, as a local sweep does (planner.sweep.fresh)."""
    runtime = ray.get_runtime_context()
    gpu_ids = tuple(str(g) for g in runtime.get_accelerator_ids().get("GPU", []))
    workdir = Path(tempfile.mkdtemp(prefix=f"planner-fresh-{point.id}-"))
    ctx = PointContext(settings=settings, corpus=corpus, output_dir=workdir, observers=[], gpu_inventory=local_gpus(gpu_ids))
    here = result.model_copy(update={"gpu_ids": list(gpu_ids)})
    try:
        check = await confirm_on_fresh_server(ctx, point, here, save=lambda: None)
        out = FreshResult(check)
        again = check.searched_again
        for relative in (check.log_path, again.log_path if again is not None else None):
            path = workdir / (relative or "")
            if relative and path.is_file():
                out.logs[relative] = path.read_bytes()
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@ray.remote
def fresh_on_node(settings: SweepSettings, corpus: Corpus, point: Point, result: PointResult) -> FreshResult:
    return asyncio.run(_fresh_on_node(settings, corpus, point, result))


@ray.remote
def point_on_node(settings: SweepSettings, corpus: Corpus, point: Point, result: PointResult, relay: Queue) -> NodeResult:
    return asyncio.run(_on_node(settings, corpus, point, result, relay))
