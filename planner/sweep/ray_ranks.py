"""The other nodes of a point that vLLM spreads over several ([grid.extra] nnodes = [N]).

vLLM's multi-node mode runs `vllm serve ... --nnodes N` once on each node: rank 0, with
`--node-rank 0 --master-addr ITS_ADDRESS --master-port P`, serves the API; ranks 1..N-1 add
`--node-rank k --headless` and join rank 0's torch.distributed group. Such a point's placement
group has one bundle of GPUs / N GPUs per node (STRICT_SPREAD). Its Ray task runs in bundle 0 and
is rank 0 (the point as on one node, planner.sweep.ray_executor); it starts one HeadlessRank actor
in each other bundle. The actors belong to the task: when its worker dies (cancelled, or its node
lost) Ray kills them, and each actor's launcher reaper then stops its vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from planner import gpus as gpu_mod
from planner.capacity import Failure
from planner.errors import ConfigError
from planner.launcher import VllmServer
from planner.sweep.config import SweepSettings
from planner.sweep.grid import Point
from planner.sweep.results import NodeRank
from planner.vllm_log import classify_failure, log_tail

# How often a headless rank whose actor died before it started is placed again.
_RESPAWN_EVERY_S = 2.0
# Beyond the server's own stop_grace_s: the time to reach an actor and have its log back.
_STOP_SLACK_S = 10.0


class PeerLost(Exception):
    """A headless rank's node (or its actor) went away. The point's task raises it so that Ray
    reruns the whole point ([executor] max_retries), as for rank 0's own node."""


class PeerStartFailed(Exception):
    """A headless rank's server command could not be run at all (the point fails, no rerun)."""


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


def accelerator_type(node_id: str) -> str | None:
    """The node's GPU model as Ray knows it (its accelerator_type:<model> resources)."""
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            models = sorted(k.removeprefix("accelerator_type:") for k in node["Resources"] if k.startswith("accelerator_type:"))
            return ", ".join(models) or None
    return None


@ray.remote(max_restarts=0, max_task_retries=0)
class HeadlessRank:
    """vLLM rank `rank` (> 0) of a point, headless, on the GPUs Ray gave this actor."""

    def __init__(self, settings: SweepSettings, point: Point, rank: int, master_addr: str, master_port: int) -> None:
        runtime = ray.get_runtime_context()
        self.gpu_ids = tuple(str(g) for g in runtime.get_accelerator_ids().get("GPU", []))
        self.node_id = runtime.get_node_id()
        self.rank = rank
        self.workdir = Path(tempfile.mkdtemp(prefix=f"planner-point-{point.id}-rank{rank}-"))
        s = settings.server
        self.server = VllmServer(
            s.command,
            model=s.model,
            log_path=self.workdir / "server.log",
            host=s.host,
            args=[*s.args, *point.flags, *rank_flags(rank, master_addr, master_port)],
            env={**s.env, **point.env},
            api_key=s.api_key.get_secret_value() if s.api_key else None,
            startup_timeout_s=s.startup_timeout_s,
            stop_grace_s=s.stop_grace_s,
            cuda_visible_devices=gpu_mod.cuda_visible_devices(self.gpu_ids) if self.gpu_ids else None,
            headless=True,
        )

    async def start(self) -> dict[str, Any]:
        await self.server.start()
        models = sorted({g.name for g in local_gpus(self.gpu_ids)})
        return NodeRank(
            rank=self.rank,
            node_id=self.node_id,
            node_hostname=socket.gethostname(),
            gpu_ids=list(self.gpu_ids),
            gpu_model=", ".join(models) or accelerator_type(self.node_id),
        ).model_dump(mode="json")

    async def wait_exit(self) -> int:
        return await self.server.wait_exit()

    async def stop(self) -> dict[str, Any]:
        await self.server.stop()
        log = self.server.log_path.read_bytes() if self.server.log_path.is_file() else b""
        shutil.rmtree(self.workdir, ignore_errors=True)
        return {"exit_code": self.server.exit_code, "log": log}


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
        timeout = self.settings.server.startup_timeout_s
        try:
            self.ranks = await asyncio.wait_for(
                asyncio.gather(*(self._start(rank) for rank in range(1, self.point.nnodes))), timeout
            )
        except TimeoutError:
            raise PeerLost(
                f"the point's other nodes did not start within [server] startup_timeout_s = {timeout:g} s"
            ) from None
        except RayTaskError as exc:
            raise PeerStartFailed(f"a headless rank did not start: {exc.cause}") from None
        return self.ranks

    async def _start(self, rank: int) -> NodeRank:
        # Right after a node was lost, the placement group's bundle on it may not have moved to a
        # live node yet: an actor placed there dies at once. Place it again until it starts (or
        # start() gives up at startup_timeout_s).
        while True:
            actor = self.actors[rank] = self._spawn(rank)
            try:
                return NodeRank.model_validate(await actor.start.remote())
            except RayActorError:
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
        rank = waits[first]
        try:
            return rank, first.result(), None
        except RayError as exc:
            return rank, None, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"

    def failure(self, rank: NodeRank, exit_code: int, *, ready: bool) -> Failure:
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
                out = stop.result()
                self.logs[rank.rank] = out["log"]
                rank.exit_code = out["exit_code"]
        for stop in stops:
            stop.cancel()
        for actor in self.actors.values():
            # An actor that did not answer is killed; its reaper stops its server.
            with contextlib.suppress(RayError):
                ray.kill(actor)


async def _await(ref: ray.ObjectRef) -> Any:
    return await ref
