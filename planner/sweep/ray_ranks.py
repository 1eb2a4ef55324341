"""The other nodes of a point that vLLM spreads over several ([grid.extra] nnodes = [N]).

vLLM's multi-node mode runs `vllm serve ... --nnodes N` once on each node: rank 0, with
`--node-rank 0 --master-addr ITS_ADDRESS --master-port P`, serves the API; ranks 1..N-1 add
`--node-rank k --headless` and join rank 0's torch.distributed group. Such a point's placement
group has one bundle of GPUs / N GPUs per node (STRICT_SPREAD). Its Ray task runs in bundle 0 and
is rank 0 (the point as on one node, planner.sweep.ray_node); it starts one HeadlessRank actor
in each other bundle. The actors belong to the task: when its worker dies (cancelled, or its node
lost) Ray kills them, and each actor's launcher reaper then stops its vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from planner import gpus as gpu_mod
from planner.capacity import Failure
from planner.errors import ConfigError, PeerLost, PeerStartFailed
from planner.sweep.config import SweepSettings
from planner.sweep.grid import Point
from planner.sweep.point import point_server
from planner.sweep.results import NodeRank
from planner.vllm_log import classify_failure, log_tail

# Ray exposes a node's GPU model as the resource accelerator_type:<model> (value 1).
ACCELERATOR_PREFIX = "accelerator_type:"
# How often a headless rank whose actor died before it started is placed again.
_RESPAWN_EVERY_S = 2.0
# How long the headless ranks may take to be placed and started.
PLACEMENT_TIMEOUT_S = 120.0
# How long a headless rank's actor may take to answer whether its vLLM still runs.
PING_TIMEOUT_S = 10.0
# Beyond the server's own stop_grace_s: VllmServer.stop's own waits (up to 15 s after SIGKILL and
# for its reaper) and the round trip to the actor.
_STOP_SLACK_S = 20.0


def rank_flags(rank: int, master_addr: str, master_port: int) -> list[str]:
    flags = ["--node-rank", str(rank), "--master-addr", master_addr, "--master-port", str(master_port)]
    return flags if rank == 0 else [*flags, "--headless"]


def rank_log_path(point_id: str, rank: int) -> str:
    return str(Path("points") / point_id / f"server-rank{rank}.log")


def local_gpus(gpu_ids: tuple[str, ...]) -> list[gpu_mod.Gpu]:
    try:
        return [g for g in gpu_mod.discover("auto") if g.index in gpu_ids]
    except ConfigError:
        return []  # nvidia-smi fails here: the point still runs, unsampled


def node_models(resources: dict[str, float]) -> list[str]:
    """The GPU models among a node's Ray resources."""
    return sorted(k.removeprefix(ACCELERATOR_PREFIX) for k in resources if k.startswith(ACCELERATOR_PREFIX))


def accelerator_type(node_id: str) -> str | None:
    """The node's GPU model as Ray knows it."""
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return ", ".join(node_models(node["Resources"])) or None
    return None


@dataclass(frozen=True)
class RankStopped:
    """What a headless rank leaves when it stops: its vLLM's exit code and its log, which lived
    on its own node."""

    exit_code: int | None
    log: bytes


@ray.remote(max_restarts=0, max_task_retries=0)
class HeadlessRank:
    """vLLM rank `rank` (> 0) of a point, headless, on the GPUs Ray gave this actor."""

    def __init__(self, settings: SweepSettings, point: Point, rank: int, master_addr: str, master_port: int) -> None:
        runtime = ray.get_runtime_context()
        self.gpu_ids = tuple(str(g) for g in runtime.get_accelerator_ids().get("GPU", []))
        self.node_id = runtime.get_node_id()
        self.rank = rank
        self.workdir = Path(tempfile.mkdtemp(prefix=f"planner-point-{point.id}-rank{rank}-"))
        self.server = point_server(
            settings,
            point,
            log_path=self.workdir / "server.log",
            gpu_ids=self.gpu_ids,
            extra_args=tuple(rank_flags(rank, master_addr, master_port)),
            headless=True,
        )

    async def start(self) -> NodeRank:
        await self.server.start()
        models = sorted({g.name for g in local_gpus(self.gpu_ids)})
        return NodeRank(
            rank=self.rank,
            node_id=self.node_id,
            node_hostname=socket.gethostname(),
            gpu_ids=list(self.gpu_ids),
            gpu_model=", ".join(models) or accelerator_type(self.node_id),
        )

    async def wait_exit(self) -> int:
        return await self.server.wait_exit()

    def exit_code(self) -> int | None:
        """None while its vLLM runs (and the actor answering at all says its node is up)."""
        return self.server.exit_code

    async def stop(self) -> RankStopped:
        await self.server.stop()
        log = self.server.log_path.read_bytes() if self.server.log_path.is_file() else b""
        shutil.rmtree(self.workdir, ignore_errors=True)
        return RankStopped(exit_code=self.server.exit_code, log=log)


class HeadlessRanks:
    """Ranks 1..N-1 of a point, seen from its task (rank 0) in the point's placement group."""

    def __init__(self, settings: SweepSettings, point: Point, master_addr: str, master_port: int) -> None:
        self.settings = settings
        self.point = point
        self.master = (master_addr, master_port)
        group: PlacementGroup | None = ray.util.get_current_placement_group()
        if group is None:
            raise RuntimeError("a point across nodes runs in its placement group; this task has none")
        self.group = group
        # Each rank's actor: the last one placed for it.
        self.actors: dict[int, Any] = {}
        self.ranks: list[NodeRank] = []
        self.logs: dict[int, bytes] = {}
        self._stopped = False

    def _spawn(self, rank: int) -> Any:
        return HeadlessRank.options(
            num_gpus=self.point.gpus_per_node,
            num_cpus=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank),
        ).remote(self.settings, self.point, rank, *self.master)

    async def start(self) -> list[NodeRank]:
        """Every headless rank's process started (they then wait for rank 0 to join them)."""
        # Placing an actor and starting a process take seconds; a bundle that finds no node in this
        # time has none to go to (STRICT_SPREAD: a lost node needs a spare one), so the point is
        # rerun (or recorded node_lost) instead of holding its other GPUs idle.
        timeout = min(self.settings.server.startup_timeout_s, PLACEMENT_TIMEOUT_S)
        try:
            async with asyncio.timeout(timeout):
                # A rank that cannot start stops the others' attempts too.
                async with asyncio.TaskGroup() as group:
                    starts = [group.create_task(self._start(rank)) for rank in range(1, self.point.nnodes)]
        except TimeoutError:
            raise PeerLost(f"the point's other nodes did not start within {timeout:g} s (no live node for their bundles)") from None
        except ExceptionGroup as errors:
            failed = [e for e in errors.exceptions if isinstance(e, PeerStartFailed)]
            if failed:
                raise failed[0] from None
            raise
        self.ranks = [t.result() for t in starts]
        return self.ranks

    async def _start(self, rank: int) -> NodeRank:
        # Right after a node was lost, the placement group's bundle on it may not have moved to a
        # live node yet: an actor placed there dies at once. Place it again until it starts (or
        # start() gives up).
        while True:
            actor = self.actors[rank] = self._spawn(rank)
            try:
                return await actor.start.remote()
            except RayTaskError as exc:
                raise PeerStartFailed(f"rank {rank} did not start: {exc.cause}") from None
            except RayActorError as exc:
                if exc.actor_init_failed:
                    raise PeerStartFailed(f"rank {rank}'s actor failed to start: {_one_line(exc)}") from None
                await asyncio.sleep(_RESPAWN_EVERY_S)

    def _started(self) -> list[Any]:
        return [self.actors[r.rank] for r in self.ranks]

    async def first_exit(self) -> tuple[NodeRank, int | None, str | None]:
        """The first headless rank whose vLLM exits: its exit code, or the Ray error when its actor
        (or node) went away instead."""
        waits = {asyncio.ensure_future(_await(a.wait_exit.remote())): rank for a, rank in zip(self._started(), self.ranks)}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        first = next(iter(done))
        return _outcome(waits[first], first)

    async def check(self) -> tuple[NodeRank, int | None, str | None] | None:
        """Whether every headless rank still runs, asked of each actor directly: Ray's own health
        checks take a minute to call a node dead. None when all do; else the first that does not,
        as first_exit() reports it (an actor that does not answer in time counts as lost)."""
        asks = {asyncio.ensure_future(_await(a.exit_code.remote())): rank for a, rank in zip(self._started(), self.ranks)}
        if not asks:
            return None
        await asyncio.wait(asks, timeout=PING_TIMEOUT_S)
        for ask, rank in asks.items():
            if not ask.done():
                ask.cancel()
                return rank, None, f"its actor did not answer within {PING_TIMEOUT_S:g} s"
            outcome = _outcome(rank, ask)
            if outcome[1] is not None or outcome[2] is not None:
                return outcome
        return None

    def failure(self, rank: NodeRank, exit_code: int | None, *, ready: bool) -> Failure:
        """Why the point failed when a headless rank's vLLM exited on its own, from that rank's log."""
        log = self.logs.get(rank.rank, b"").decode(errors="replace")
        where = f"rank {rank.rank} of {self.point.nnodes} (node {rank.node_hostname})"
        if ready:
            return Failure(
                kind="server_died",
                message=f"vLLM's {where} exited with code {exit_code} during the replay",
                exit_code=exit_code,
                log_tail=log_tail(log),
            )
        failure = classify_failure(
            log, exit_code=exit_code, timed_out=False, startup_timeout_s=self.settings.server.startup_timeout_s
        )
        failure.message = f"{where}: {failure.message}"
        return failure

    async def stop(self) -> None:
        """Stop every headless rank (SIGTERM, SIGKILL after stop_grace_s) and keep its log. Once."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.settings.server.stop_grace_s + _STOP_SLACK_S
        stops = [asyncio.ensure_future(_await(a.stop.remote())) for a in self._started()]
        if stops:
            await asyncio.wait(stops, timeout=grace)
        for rank, stop in zip(self.ranks, stops):
            if stop.done() and not stop.cancelled() and stop.exception() is None:
                out: RankStopped = stop.result()
                self.logs[rank.rank] = out.log
                rank.exit_code = out.exit_code
        for stop in stops:
            stop.cancel()
        for actor in self.actors.values():
            # An actor that did not answer is killed; its reaper stops its server.
            with contextlib.suppress(RayError):
                ray.kill(actor)


def _outcome(rank: NodeRank, answer: asyncio.Future) -> tuple[NodeRank, int | None, str | None]:
    try:
        return rank, answer.result(), None
    except RayTaskError:
        raise  # a bug in the actor's own code: the point fails as a planner error, not rerun
    except RayError as exc:
        return rank, None, _one_line(exc)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


async def _await(ref: ray.ObjectRef) -> Any:
    return await ref
