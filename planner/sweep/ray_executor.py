"""Sweeps on a Ray cluster: every grid point is one Ray task on the node that holds its GPUs.

    driver (planner sweep)                          node with the point's GPUs
    ----------------------                          --------------------------
    placement group, STRICT_PACK:                   _point_on_node (a Ray task in that group):
      {GPU: tp x pp, CPU: cpus_per_point, ...}        CUDA_VISIBLE_DEVICES = the GPUs Ray assigned
    corpus, settings: ray.put once  ------------->    the point as run locally (run._run_point):
    relay queue (an actor on the driver's node) <--   vLLM on loopback, the same search, events and
    sweep.json, rewritten as results come   <------   result snapshots; returns result + server log

Ray does the scheduling (placement groups wait for free GPUs), the retries (`max_retries` of a
task whose node or worker died; `retry_exceptions=False`, so a point that failed on its own is
never rerun) and the cancelling (`ray.cancel(force=True)` kills the task's worker; the
launcher's reaper on that node then stops the vLLM server).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError, TaskCancelledError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.queue import Queue
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from planner import gpus as gpu_mod
from planner.errors import ConfigError
from planner.sweep.config import ExecutorSection, SweepSettings
from planner.sweep.grid import Point
from planner.sweep.observer import SweepObservers
from planner.sweep.relay import RelayObserver, dispatch
from planner.sweep.results import Failure, PointResult, SweepResults
from planner.sweep.run import SweepContext, _now, _record_prediction_error, _run_point
from replay.corpus import Corpus

# Ray exposes a node's GPU model as the resource accelerator_type:<model> (value 1).
ACCELERATOR_PREFIX = "accelerator_type:"
# A point asks for a sliver of it, which is enough to be placed only where it exists.
ACCELERATOR_AMOUNT = 0.001
# Every Ray cluster's head node has this resource (value 1).
HEAD_RESOURCE = "node:__internal_head__"
HEAD_AMOUNT = 0.001
# How often a node sends its point's events to the driver.
RELAY_EVERY_S = 0.25
# Lines of a Ray error kept in a failure message (its tracebacks run long).
_ERROR_LINES = 6


def _short(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: " + " ".join(lines[:_ERROR_LINES])


def _node_models(resources: dict[str, float]) -> list[str]:
    return sorted(k.removeprefix(ACCELERATOR_PREFIX) for k in resources if k.startswith(ACCELERATOR_PREFIX))


class RayCluster:
    """The driver's side: a connection to the cluster and the points running on it."""

    def __init__(self, executor: ExecutorSection, *, owns_connection: bool, nodes: list[dict] | None = None) -> None:
        self.executor = executor
        self._owns_connection = owns_connection
        # ray.nodes()'s entries: NodeID, Alive, NodeManagerHostname, Resources, ...
        self.nodes = [n for n in (ray.nodes() if nodes is None else nodes) if n.get("Alive")]

    @classmethod
    def connect(cls, executor: ExecutorSection) -> RayCluster:
        if ray.is_initialized():
            # A caller (a notebook, a test) already holds a connection: use it, leave it open.
            return cls(executor, owns_connection=False)
        # ray.init replaces the SIGTERM handler with sys.exit(15); the command's own (planner.interrupt:
        # cancel the sweep, keep what was measured, exit 143) must stay.
        sigterm = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(address=executor.address, runtime_env=executor.runtime_env, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"[executor] address {executor.address!r}: cannot connect to a Ray cluster ({_short(exc)}); start one"
                " with `ray start --head` (and `ray start --address HEAD:6379` on the other nodes), or give its"
                " address (HOST:PORT, ray://HOST:10001)"
            ) from None
        finally:
            # Off the main thread neither handler can be set (ValueError): nothing was replaced.
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGTERM, sigterm)
        return cls(executor, owns_connection=True)

    def close(self) -> None:
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()

    # -- placement ------------------------------------------------------------------------------

    def bundle(self, point: Point) -> dict[str, float]:
        """What one point holds on its node: its GPUs, CPUs for the server and the client, and
        whatever [executor.node_selector] asks for."""
        selector = self.executor.node_selector
        wanted: dict[str, float] = {"GPU": float(point.gpus), "CPU": self.executor.cpus_per_point}
        if selector.gpu_type:
            wanted[ACCELERATOR_PREFIX + selector.gpu_type] = ACCELERATOR_AMOUNT
        wanted.update(selector.resources)
        # Ray refuses bundles with a zero amount.
        return {k: v for k, v in wanted.items() if v > 0}

    def unplaceable(self, point: Point) -> Failure | None:
        """Why no node of the cluster can ever hold the point (None when one can)."""
        need = self.bundle(point)
        if any(all(n["Resources"].get(k, 0.0) >= v for k, v in need.items()) for n in self.nodes):
            return None
        have = "; ".join(
            f"{n['NodeManagerHostname']} ({n['NodeID'][:8]}): {n['Resources'].get('GPU', 0):g} GPU"
            + "".join(f" {m}" for m in _node_models(n["Resources"]))
            + f", {n['Resources'].get('CPU', 0):g} CPU"
            + "".join(
                f", {k} {n['Resources'].get(k, 0):g}" for k in self.executor.node_selector.resources
            )
            for n in self.nodes
        )
        wants = ", ".join(f"{k} {v:g}" for k, v in need.items())
        return Failure(
            kind="not_enough_gpus",
            message=f"the point needs {wants} on one node (GPUs = tensor x pipeline parallel); the cluster's nodes have: {have or 'none'}",
        )

    # -- running --------------------------------------------------------------------------------

    async def run(self, ctx: SweepContext, todo: list[tuple[Point, PointResult]]) -> None:
        if not todo:
            return
        # On the head node (Ray's node:__internal_head__ resource), so the relay does not go down
        # with a node that runs points; the driver itself may be attached to any node.
        relay = Queue(actor_options={"num_cpus": 0, "resources": {HEAD_RESOURCE: HEAD_AMOUNT}})
        settings_ref, corpus_ref = ray.put(ctx.settings), ray.put(ctx.corpus)
        by_id = {point.id: result for point, result in todo}
        finished: set[str] = set()
        groups: list[PlacementGroup] = []
        refs: list[ray.ObjectRef] = []
        cpus = self.executor.cpus_per_point
        for point, result in todo:
            bundle = self.bundle(point)
            group = placement_group([bundle], strategy="STRICT_PACK")
            groups.append(group)
            refs.append(
                _point_on_node.options(
                    num_gpus=point.gpus,
                    num_cpus=cpus,
                    resources={k: v for k, v in bundle.items() if k not in ("GPU", "CPU")},
                    max_retries=self.executor.max_retries,
                    retry_exceptions=False,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
                    name=f"planner-point-{point.id}",
                ).remote(settings_ref, corpus_ref, point, result, relay)
            )

        def on_events(point_id: str, events: list) -> None:
            def adopt(snapshot: dict) -> None:
                if point_id not in finished:
                    _adopt(by_id[point_id], snapshot)
                    ctx.save()

            dispatch(point_id, events, ctx.observers, adopt)

        draining = asyncio.create_task(_drain(relay, on_events))
        try:
            await asyncio.gather(
                *(
                    self._collect(ctx, ref, group, point, result, finished)
                    for ref, group, (point, result) in zip(refs, groups, todo)
                )
            )
        except asyncio.CancelledError:
            # Ctrl-C / SIGTERM: kill every point's worker; each node's reaper stops its server.
            for ref in refs:
                with contextlib.suppress(RayError):
                    ray.cancel(ref, force=True)
            raise
        finally:
            draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await draining
            for group in groups:
                _release(group)
            with contextlib.suppress(RayError):
                ray.kill(relay.actor)

    async def _collect(
        self,
        ctx: SweepContext,
        ref: ray.ObjectRef,
        group: PlacementGroup,
        point: Point,
        result: PointResult,
        finished: set[str],
    ) -> None:
        try:
            out = await ref
        except asyncio.CancelledError:
            if result.status == "running":
                result.status = "failed"
                result.failure = Failure(kind="interrupted", message="the sweep was interrupted during this point")
            raise
        except TaskCancelledError as exc:
            result.status, result.failure = "failed", Failure(kind="interrupted", message=_short(exc))
        except RayTaskError as exc:
            # The point's own code lets nothing escape but a bug in the planner.
            result.status = "failed"
            result.failure = Failure(kind="planner_error", message=_short(exc), log_tail=str(exc).splitlines()[-20:])
        except RayError as exc:
            result.status = "failed"
            result.failure = Failure(
                kind="node_lost",
                message=f"lost with its node or worker {self.executor.max_retries + 1} time(s)"
                f" ([executor] max_retries = {self.executor.max_retries}): {_short(exc)}",
            )
        else:
            _adopt(result, out["result"])
            if out["server_log"] is not None and result.log_path:
                log = ctx.output_dir / result.log_path
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_bytes(out["server_log"])
        finally:
            # The group holds its GPUs until removed: the next waiting point gets them now.
            _release(group)
            finished.add(point.id)
            _record_prediction_error(result)
            ctx.save()
        SweepObservers(*ctx.observers).point_finished(point.id, result.safe_concurrency_per_gpu)


def _release(group: PlacementGroup) -> None:
    with contextlib.suppress(RayError):
        remove_placement_group(group)


def _adopt(result: PointResult, snapshot: dict) -> None:
    """Take over what a node reported, in place (the sweep's list holds this object)."""
    fresh = PointResult.model_validate(snapshot)
    for name in PointResult.model_fields:
        setattr(result, name, getattr(fresh, name))


async def _drain(relay: Queue, on_events) -> None:
    while True:
        try:
            point_id, events = await relay.get_async()
        except RayError:
            # The relay is gone (its node died): live progress stops, but every point's result
            # still comes back as its task's return value.
            return
        on_events(point_id, events)


# -- on the node ---------------------------------------------------------------------------------


class _NodeContext(SweepContext):
    """The point's context on its node: saving sends the result to the driver, which owns sweep.json."""

    relay: RelayObserver | None = None

    def save(self) -> None:
        if self.relay is not None:
            self.relay.result(self.results.points[0])


def _local_gpus(gpu_ids: tuple[str, ...]) -> list[gpu_mod.Gpu]:
    try:
        return [g for g in gpu_mod.discover("auto") if g.index in gpu_ids]
    except ConfigError:
        return []  # nvidia-smi fails here: the point still runs, unsampled


def _accelerator_type(node_id: str) -> str | None:
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return ", ".join(_node_models(node["Resources"])) or None
    return None


async def _send(relay: Queue, point_id: str, observer: RelayObserver) -> None:
    events = observer.take()
    if events:
        try:
            await relay.put_async((point_id, events))
        except RayError:
            pass  # the driver is gone; the point's result still travels back as the task's return value


async def _on_node(settings: SweepSettings, corpus: Corpus, point: Point, result: PointResult, relay: Queue) -> dict[str, Any]:
    runtime = ray.get_runtime_context()
    gpu_ids = tuple(str(g) for g in runtime.get_accelerator_ids().get("GPU", []))
    workdir = Path(tempfile.mkdtemp(prefix=f"planner-point-{point.id}-"))
    observer = RelayObserver()
    # A retried point starts over: nothing of the attempt its node took down is kept.
    result = PointResult.model_validate(
        {**result.model_dump(), "steps": [], "node_id": runtime.get_node_id(), "node_hostname": socket.gethostname()}
    )
    inventory = _local_gpus(gpu_ids)
    result.gpu_model = ", ".join(sorted({g.name for g in inventory})) or _accelerator_type(result.node_id)
    ctx = _NodeContext(
        settings=settings,
        corpus=corpus,
        output_dir=workdir,
        results=SweepResults(started_at=_now(), settings={}, points=[result]),
        observers=[observer],
        gpu_inventory=inventory,
    )
    ctx.relay = observer
    observer.point_placed(point.id, result.node_hostname, result.gpu_model)

    async def pump() -> None:
        while True:
            await asyncio.sleep(RELAY_EVERY_S)
            await _send(relay, point.id, observer)

    pumping = asyncio.create_task(pump())
    try:
        await _run_point(ctx, point, result, gpu_ids)
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
        await _send(relay, point.id, observer)
    log = workdir / (result.log_path or "")
    server_log = log.read_bytes() if result.log_path and log.is_file() else None
    shutil.rmtree(workdir, ignore_errors=True)
    return {"result": result.model_dump(mode="json"), "server_log": server_log}


@ray.remote
def _point_on_node(settings: SweepSettings, corpus: Corpus, point: Point, result: PointResult, relay: Queue) -> dict[str, Any]:
    return asyncio.run(_on_node(settings, corpus, point, result, relay))
