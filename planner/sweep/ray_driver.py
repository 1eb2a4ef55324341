"""Sweeps on a Ray cluster, the driver's side: every grid point is one Ray task on the node that
holds its GPUs (the node's side: planner.sweep.ray_node).

    driver (planner sweep)                          node with the point's GPUs
    ----------------------                          --------------------------
    placement group, STRICT_PACK:                   point_on_node (planner.sweep.ray_node, a Ray task):
      {GPU: tp x pp, CPU: cpus_per_point, ...}        CUDA_VISIBLE_DEVICES = the GPUs Ray assigned
      (nnodes > 1: one such bundle of tp x pp /       (nnodes > 1: vLLM's rank 0 here, and one
       nnodes GPUs per node, STRICT_SPREAD)            HeadlessRank actor per other bundle)
    corpus, settings: ray.put once  ------------->    the point as run locally (point.run_point):
    relay queue (an actor on the driver's node) <--   vLLM on loopback, the same search, events and
    sweep.json, rewritten as results come   <------   result snapshots; returns a NodeResult

Ray does the scheduling (placement groups wait for free GPUs), the retries (`max_retries` of a
task whose node or worker died; `retry_exceptions=[PeerLost]`, raised when another node of a
point across nodes was lost, so a point that failed on its own is never rerun) and the cancelling (`ray.cancel(force=True)` kills
the task's worker; the launcher's reaper on that node then stops the vLLM server).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time

import ray
from ray.exceptions import RayError, RayTaskError, TaskCancelledError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.queue import Queue
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from planner.capacity import Failure
from planner.errors import ConfigError, PeerLost
from planner.gpus import Gpu
from planner.sweep.config import ExecutorSection
from planner.sweep.executor import SweepContext, Todo
from planner.sweep.grid import Point
from planner.sweep.observer import SweepObservers
from planner.sweep.outcome import interrupted, knee_band_per_gpu
from planner.sweep.point import now, record_prediction_error
from planner.sweep.ray_node import FreshResult, NodeResult, fresh_on_node, point_on_node
from planner.sweep.ray_ranks import ACCELERATOR_PREFIX, node_models
from planner.sweep.relay import dispatch
from planner.sweep.results import FreshServerCheck, PointResult

# A point asks for a sliver of it, which is enough to be placed only where it exists.
ACCELERATOR_AMOUNT = 0.001
# Every Ray cluster's head node has this resource (value 1).
HEAD_RESOURCE = "node:__internal_head__"
HEAD_AMOUNT = 0.001
# Lines of a Ray error kept in a failure message (its tracebacks run long).
_ERROR_LINES = 6
# A ray:// connection makes the head's proxier start a client server for this driver, a process
# forked from a multi-threaded gRPC server, and that start sometimes fails at once; a new
# connection asks for a new one. Tried this many times in all, after these waits. Ray says so in
# one of two ways: its own line, or a traceback out of the proxier's start_specific_server (the
# process exited while the proxier waited on it, and psutil's read of its command line raised; a
# fresh-clone CI run met it in tests/integration/test_sweep_ray.py).
CLIENT_SERVER_START_FAILED = "Starting Ray client server failed"
CLIENT_SERVER_START_RAISED = "in start_specific_server"
TRANSIENT_MARKERS = (CLIENT_SERVER_START_FAILED, CLIENT_SERVER_START_RAISED)
CONNECT_ATTEMPTS = 3
CONNECT_BACKOFF_S = (1.0, 2.0)


def short_error(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: " + " ".join(lines[:_ERROR_LINES])


def _init_with_retries(executor: ExecutorSection, *, sleep=time.sleep) -> None:
    """ray.init, tried again (at most CONNECT_ATTEMPTS times) only when the head's proxier said its
    client server failed to start; any other failure, or the last one, is a ConfigError that
    quotes Ray's line and says how many tries it took."""
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            ray.init(address=executor.address, runtime_env=executor.runtime_env, log_to_driver=False)
            return
        except (ConnectionError, ValueError, RuntimeError) as exc:
            # A failed ray:// connection can leave client mode half set up, and every later
            # ray.init in this process would then fail too: undo it.
            with contextlib.suppress(Exception):
                ray.shutdown()
            transient = any(marker in str(exc) for marker in TRANSIENT_MARKERS)
            if transient and attempt < CONNECT_ATTEMPTS:
                wait_s = CONNECT_BACKOFF_S[attempt - 1]
                print(
                    f"planner: Ray's proxier at {executor.address} said {_quoted_line(exc)!r} (try {attempt} of"
                    f" {CONNECT_ATTEMPTS}); connecting again in {wait_s:g} s",
                    file=sys.stderr,
                )
                sleep(wait_s)
                continue
            tries = f" on each of {attempt} tries" if transient else ""
            raise ConfigError(
                f"[executor] address {executor.address!r}: cannot connect to a Ray cluster{tries} ({short_error(exc)});"
                " start one with `ray start --head` (and `ray start --address HEAD:6379` on the other nodes), or"
                " give its address (HOST:PORT, ray://HOST:10001)"
            ) from None


def _quoted_line(exc: BaseException) -> str:
    """The line of Ray's error that names the failure (its message opens with a generic preface)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = (line for marker in TRANSIENT_MARKERS for line in lines if marker in line)
    return next(named, lines[-1] if lines else type(exc).__name__)


class RayExecutor:
    """The driver's side: a connection to the cluster and the points running on it (an Executor)."""

    def __init__(self, executor: ExecutorSection, *, owns_connection: bool, nodes: list[dict] | None = None) -> None:
        self.executor = executor
        self._owns_connection = owns_connection
        # ray.nodes()'s entries: NodeID, Alive, NodeManagerHostname, Resources, ...
        self.nodes = [n for n in (ray.nodes() if nodes is None else nodes) if n.get("Alive")]

    @classmethod
    def connect(cls, executor: ExecutorSection) -> RayExecutor:
        if ray.is_initialized():
            # A caller (a notebook, a test) already holds a connection: use it, leave it open.
            return cls(executor, owns_connection=False)
        # ray.init replaces the SIGTERM handler with sys.exit(15); the command's own (planner.interrupt:
        # cancel the sweep, keep what was measured, exit 143) must stay.
        sigterm = signal.getsignal(signal.SIGTERM)
        try:
            _init_with_retries(executor)
        finally:
            # Off the main thread neither handler can be set (ValueError): nothing was replaced.
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGTERM, sigterm)
        return cls(executor, owns_connection=True)

    def close(self) -> None:
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()

    def inventory(self) -> list[Gpu]:
        # This machine's GPUs are not the ones points run on.
        return []

    # -- placement ------------------------------------------------------------------------------

    def bundle(self, point: Point) -> dict[str, float]:
        """What one point holds on (each of) its node(s): its GPUs, CPUs for the server and the
        client, and whatever [executor.node_selector] asks for."""
        selector = self.executor.node_selector
        wanted: dict[str, float] = {"GPU": float(point.gpus_per_node), "CPU": self.executor.cpus_per_point}
        if selector.gpu_type:
            wanted[ACCELERATOR_PREFIX + selector.gpu_type] = ACCELERATOR_AMOUNT
        wanted.update(selector.resources)
        # Ray refuses bundles with a zero amount.
        return {k: v for k, v in wanted.items() if v > 0}

    def unplaceable(self, point: Point) -> Failure | None:
        """Why no node of the cluster can ever hold the point (None when one can)."""
        need = self.bundle(point)
        fitting = [n for n in self.nodes if all(n["Resources"].get(k, 0.0) >= v for k, v in need.items())]
        if len(fitting) >= point.nnodes:
            return None
        have = "; ".join(
            f"{n['NodeManagerHostname']} ({n['NodeID'][:8]}): {n['Resources'].get('GPU', 0):g} GPU"
            + "".join(f" {m}" for m in node_models(n["Resources"]))
            + f", {n['Resources'].get('CPU', 0):g} CPU"
            + "".join(
                f", {k} {n['Resources'].get(k, 0):g}" for k in self.executor.node_selector.resources
            )
            for n in self.nodes
        )
        wants = ", ".join(f"{k} {v:g}" for k, v in need.items())
        where = (
            "on one node (GPUs = tensor x pipeline parallel)"
            if point.nnodes == 1
            else f"on each of {point.nnodes} nodes (nnodes = {point.nnodes}; GPUs = tensor x pipeline parallel / nnodes)"
        )
        return Failure(
            kind="not_enough_gpus",
            message=f"the point needs {wants} {where}; the cluster's nodes have: {have or 'none'}",
        )

    # -- running --------------------------------------------------------------------------------

    async def run(self, ctx: SweepContext, todo: Todo) -> None:
        if not todo:
            return
        shared = ctx.shared
        # On the head node (Ray's node:__internal_head__ resource), so the relay does not go down
        # with a node that runs points; the driver itself may be attached to any node.
        relay = Queue(actor_options={"num_cpus": 0, "resources": {HEAD_RESOURCE: HEAD_AMOUNT}})
        settings_ref, corpus_ref = ray.put(shared.settings), ray.put(shared.corpus)
        by_id = {point.id: result for point, result in todo}
        finished: set[str] = set()
        groups: list[PlacementGroup] = []
        refs: list[ray.ObjectRef] = []
        cpus = self.executor.cpus_per_point
        for point, result in todo:
            bundle = self.bundle(point)
            # A point across nodes: one bundle per node, each on a node of its own.
            group = placement_group([bundle] * point.nnodes, strategy="STRICT_PACK" if point.nnodes == 1 else "STRICT_SPREAD")
            groups.append(group)
            refs.append(
                point_on_node.options(
                    num_gpus=point.gpus_per_node,
                    num_cpus=cpus,
                    resources={k: v for k, v in bundle.items() if k not in ("GPU", "CPU")},
                    max_retries=self.executor.max_retries,
                    # Only a headless rank's lost node reruns a point; nothing else it raises.
                    retry_exceptions=[PeerLost],
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
                    name=f"planner-point-{point.id}",
                ).remote(settings_ref, corpus_ref, point, result, relay)
            )

        def on_events(point_id: str, events: list) -> None:
            def adopt(snapshot: PointResult) -> None:
                if point_id not in finished:
                    _adopt(by_id[point_id], snapshot)
                    ctx.save()

            dispatch(point_id, events, shared.observers, adopt)

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
            await _stop_draining(relay, draining)
            for group in groups:
                _release(group)
            with contextlib.suppress(RayError):
                ray.kill(relay.actor)

    async def confirm_fresh(self, ctx: SweepContext, point: Point, result: PointResult) -> FreshServerCheck:
        """The recommended point's server started again as a Ray task on a node that can hold it
        (planner.sweep.ray_node.fresh_on_node); its logs come back into the output folder."""
        shared = ctx.shared
        bundle = self.bundle(point)
        group = placement_group([bundle], strategy="STRICT_PACK")
        try:
            out: FreshResult = await fresh_on_node.options(
                num_gpus=point.gpus_per_node,
                num_cpus=self.executor.cpus_per_point,
                resources={k: v for k, v in bundle.items() if k not in ("GPU", "CPU")},
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
                name=f"planner-fresh-{point.id}",
            ).remote(ray.put(shared.settings), ray.put(shared.corpus), point, result)
        except RayError as exc:
            return FreshServerCheck(
                point_id=result.id, concurrency=result.safe_concurrency or 0, started_at=now(),
                note=f"the fresh-server confirmation's task failed on the cluster: {short_error(exc)}",
            )  # fmt: skip
        finally:
            _release(group)
        for relative, content in out.logs.items():
            log = shared.output_dir / relative
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_bytes(content)
        return out.check

    async def _collect(
        self,
        ctx: SweepContext,
        ref: ray.ObjectRef,
        group: PlacementGroup,
        point: Point,
        result: PointResult,
        finished: set[str],
    ) -> None:
        shared = ctx.shared
        try:
            out: NodeResult = await ref
        except asyncio.CancelledError:
            if result.status == "running":
                result.status, result.failure = "failed", interrupted()
            raise
        except TaskCancelledError as exc:
            result.status, result.failure = "failed", interrupted(short_error(exc))
        except RayTaskError as exc:
            result.status = "failed"
            if isinstance(exc.cause, PeerLost):
                result.failure = Failure(
                    kind="node_lost",
                    message=f"a node of the point was lost {self.executor.max_retries + 1} time(s)"
                    f" ([executor] max_retries = {self.executor.max_retries}): {exc.cause.message}",
                    log_tail=exc.cause.log_tail,
                )
            else:
                # The point's own code lets nothing escape but a bug in the planner.
                result.failure = Failure(kind="planner_error", message=short_error(exc), log_tail=str(exc).splitlines()[-20:])
        except RayError as exc:
            result.status = "failed"
            result.failure = Failure(
                kind="node_lost",
                message=f"lost with its node or worker {self.executor.max_retries + 1} time(s)"
                f" ([executor] max_retries = {self.executor.max_retries}): {short_error(exc)}",
            )
        else:
            _adopt(result, out.result)
            logs = {result.log_path: out.server_log}
            logs.update({r.log_path: out.rank_logs.get(r.rank) for r in result.ranks if r.rank > 0})
            for path, content in logs.items():
                if path and content is not None:
                    log = shared.output_dir / path
                    log.parent.mkdir(parents=True, exist_ok=True)
                    log.write_bytes(content)
        finally:
            # The group holds its GPUs until removed: the next waiting point gets them now.
            _release(group)
            # Only logs that came back are pointed at (not those of a lost or interrupted attempt).
            if result.log_path and not (shared.output_dir / result.log_path).is_file():
                result.log_path = None
            for r in result.ranks:
                if r.log_path and not (shared.output_dir / r.log_path).is_file():
                    r.log_path = None
            finished.add(point.id)
            record_prediction_error(result)
            ctx.save()
        SweepObservers(*shared.observers).point_finished(point.id, result.safe_concurrency_per_gpu, knee_band_per_gpu(result))


def _release(group: PlacementGroup) -> None:
    with contextlib.suppress(RayError):
        remove_placement_group(group)


def _adopt(result: PointResult, reported: PointResult) -> None:
    """Take over what a node reported (its result, or a relayed snapshot of it), in place: the
    sweep's list holds this object."""
    for name in PointResult.model_fields:
        setattr(result, name, getattr(reported, name))


async def _drain(relay: Queue, on_events) -> None:
    while True:
        try:
            item = await relay.get_async()
        except RayError:
            # The relay is gone (its node died): live progress stops, but every point's result
            # still comes back as its task's return value.
            return
        if item is None:
            return
        on_events(*item)


async def _stop_draining(relay: Queue, draining: asyncio.Task) -> None:
    """End the drain with a last item rather than by cancelling it: a Ray Client connection
    (ray://) fails in its own thread when a pending get's future is cancelled under it."""
    try:
        with contextlib.suppress(RayError):
            await relay.put_async(None)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(draining), 5.0)
    finally:
        # Also when a second Ctrl-C cancels this wait: it then goes on up.
        if not draining.done():
            draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await draining
