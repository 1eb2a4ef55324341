"""One grid point's life, wherever it runs: its vLLM server, the search for its highest passing
concurrency, and how it ended, written into its PointResult.

    run_point(ctx, point, result, gpu_ids, save=...)
      point_server(...)          the point's vLLM command, env and GPUs
      PointRunner.run            start it; on failure classify why (status, failure)
        _search_bound            tokenize the corpus once, size the search's ceiling from the KV capacity
        _search                  Replay.search from the ceiling (or start_concurrency) downwards
        outcome.conclude         max passing, safe concurrency, knee, GPU memory peaks

Both executors call `run_point`: the local one (planner.sweep.local) with a `save` that rewrites
sweep.json, the Ray node (planner.sweep.ray_node) with one that sends the result to the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from planner import cpus as cpus_mod
from planner import gpus as gpu_mod
from planner.capacity import Failure
from planner.errors import ServerStartFailed
from planner.estimate import kv_tokens_relative_error
from planner.gpu_health import GpuHealthSampler
from planner.launcher import VllmServer
from planner.sweep.adaptive_point import planned_search, settled_by_bound
from planner.sweep.config import SweepSettings
from planner.sweep.grid import Point
from planner.sweep.liveness import Liveness
from planner.sweep.observer import SweepObserver, SweepObservers
from planner.sweep.oom import death, oom_kills
from planner.sweep.outcome import (
    UPPER_BOUND_CONSTRAINT,
    conclude,
    ended_status,
    interrupted,
    knee_band_per_gpu,
    metrics_lost,
)
from planner.sweep.results import PointResult
from planner.vllm_args import has_flag
from planner.vllm_log import log_tail
from replay.client.streaming import METRICS_CONNECTIONS, StreamingClient
from replay.corpus.jsonl import Corpus
from replay.errors import ReplayError, ServerError, StepAborted
from replay.prefix.bound import (
    VLLM_DEFAULT_MAX_TOKENS,
    concurrency_upper_bound,
    mean_blocks,
    prefix_aware_bound,
    request_blocks,
)
from replay.prefix.tokens import TOKENIZE_WORKERS, prompt_blocks, token_counts
from replay.results import StepResult
from replay.run.runner import Replay, SearchOutcome, pooled_outcome
from replay.search.pass_fit import starts_disagree
from replay.search.policy import bracket
from replay.search.verdicts import concurrency_history
from replay.step.environment import CpuProbe, WindowProbe
from replay.step.observer import Observers


# Saves the point's result where its sweep keeps it (sweep.json, or the driver across Ray).
Save = Callable[[], None]

# Starts of a point's server when the port chosen for it is taken before the server binds it.
PORT_ATTEMPTS = 3


@dataclass
class PointContext:
    """What every point of a sweep shares, on the machine where it runs."""

    settings: SweepSettings
    corpus: Corpus
    # Where the point's server logs go (points/ID/server.log under it).
    output_dir: Path
    observers: list[SweepObserver] = field(default_factory=list)
    gpu_inventory: list[gpu_mod.Gpu] = field(default_factory=list)
    # Token counts depend only on the model's tokenizer: measured once, shared by every point.
    prompt_tokens: list[int] | None = None
    # Each request's full prompt blocks (chained hashes, replay.prefix.sharing), by block size.
    prompt_blocks: dict[int, list[list[int]]] = field(default_factory=dict)
    # The server's and the planner's CPUs when [cpus] client pins them apart.
    cpus: cpus_mod.CpuSplit | None = None


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def point_server(
    settings: SweepSettings,
    point: Point,
    *,
    log_path: Path,
    gpu_ids: tuple[str, ...],
    port: int | None = None,
    cpus: cpus_mod.CpuSplit | None = None,
    extra_args: tuple[str, ...] = (),
    headless: bool = False,
) -> VllmServer:
    """The vLLM server of one point (or of one headless rank of it): [server]'s command, args and
    env, then the point's flags and env axes."""
    s = settings.server
    env = {**s.env, **point.env}
    if cpus is not None:
        env.setdefault(cpus_mod.BIND_ENV, cpus.bind_env())
    return VllmServer(
        s.command,
        model=s.model,
        log_path=log_path,
        host=s.host,
        port=port,
        args=[*s.args, *point.flags, *extra_args],
        env=env,
        api_key=s.api_key.get_secret_value() if s.api_key else None,
        startup_timeout_s=s.startup_timeout_s,
        stop_grace_s=s.stop_grace_s,
        cuda_visible_devices=gpu_mod.cuda_visible_devices(gpu_ids) if gpu_ids else None,
        cpus=cpus.server if cpus is not None else None,
        headless=headless,
    )


def log_path(point_id: str, start: int | None = None) -> Path:
    """A point's server log, relative to the results folder; a later start's ([sweep]
    server_starts) beside the first's."""
    name = "server.log" if start in (None, 1) else f"server-start{start}.log"
    return Path("points") / point_id / name


async def run_point(
    ctx: PointContext, point: Point, result: PointResult, gpu_ids: tuple[str, ...], *, save: Save
) -> None:
    """Run one point on `gpu_ids`, filling in `result` and calling `save` as it changes. Only a
    cancel escapes (with the result marked interrupted); every other failure is the point's."""
    observer = SweepObservers(*ctx.observers)
    observer.point_started(point.id, point.config, ctx.settings.server.model)
    result.started_at = now()
    result.gpu_ids = list(gpu_ids)
    models = sorted({g.name for g in ctx.gpu_inventory if g.index in gpu_ids})
    result.gpu_model = ", ".join(models) or result.gpu_model
    try:
        await PointRunner(ctx, point, result, gpu_ids, save=save).run()
    finally:
        observer.point_finished(point.id, result.safe_concurrency_per_gpu, knee_band_per_gpu(result))


def record_prediction_error(result: PointResult) -> None:
    """Once a point has ended: how far the estimate's KV tokens were from the server's own."""
    result.kv_cache_tokens_relative_error = kv_tokens_relative_error(
        result.kv_cache_tokens_predicted, result.capacity.kv_cache_tokens
    )


def output_tokens(req, settings: SweepSettings, prompt_tokens: int, max_model_len: int | None) -> int:
    """The output tokens a request asks for, as the server will generate them."""
    if req.max_tokens is not None:
        return req.max_tokens
    if settings.replay.max_tokens is not None:
        return settings.replay.max_tokens
    if settings.replay.api == "chat" and max_model_len is not None:
        # Chat without max_tokens may generate up to the rest of the context.
        return max(0, max_model_len - prompt_tokens)
    return VLLM_DEFAULT_MAX_TOKENS


class PointRunner:
    def __init__(
        self, ctx: PointContext, point: Point, result: PointResult, gpu_ids: tuple[str, ...], *, save: Save
    ) -> None:
        self.ctx = ctx
        self.point = point
        self.result = result
        self.gpu_ids = gpu_ids
        self.save = save
        # The cgroup's OOM kills when the point began (planner.sweep.oom): a rise names the killer.
        self.oom_kills_at_start: int | None = None
        # Which start of the server runs now, when the point runs on several ([sweep] server_starts).
        self.start_index: int | None = None

    def _on_step(self, step: StepResult) -> None:
        self.result.steps.append(step)
        self.save()

    def _server(self) -> VllmServer:
        return point_server(
            self.ctx.settings,
            self.point,
            log_path=self.ctx.output_dir / log_path(self.point.id, self.start_index),
            gpu_ids=self.gpu_ids,
            port=self.ctx.settings.server.port or None,
            cpus=self.ctx.cpus,
        )

    def _taken_port_note(self, failure: Failure, server: VllmServer) -> str | None:
        """The note for a start that another process's port took down, when starting again helps:
        the API port the launcher chose, or the torch.distributed port vLLM chose for its workers
        on one node. A point across nodes passes --master-port itself: its ranks start again
        together (planner.sweep.ray_node)."""
        if failure.kind == "port_taken":
            return f"port_taken: another process held port {server.port} when the server bound it; started again on another port"
        if failure.kind == "master_port_taken" and not has_flag(self.point.flags, "--master-port"):
            return (
                "master_port_taken: another process held the torch.distributed port vLLM chose for its workers"
                f" ({failure.message}); started again"
            )
        return None

    def _another_start(self, index: int) -> bool:
        """Whether the point is searched on start `index` of its server ([sweep] server_starts,
        then tie_break_starts while the starts' own knees disagree): only a point whose search
        found a passing concurrency; one predicted, verified or dominated by the adaptive
        strategy ran no search to pool."""
        r = self.result
        if not (r.status == "ok" and r.answer_source == "searched" and r.max_passing_concurrency is not None):
            return False
        sweep = self.ctx.settings.sweep
        if index <= sweep.server_starts:
            return True
        if index > sweep.server_starts + sweep.tie_break_starts or not r.start_knees:
            return False
        return starts_disagree(list(r.start_knees.values()), self.ctx.settings.replay.precision)

    def _start_name(self) -> str:
        """"start 2 of 2", or "start 3 (tie-break)" for one that settles a disagreement."""
        starts = self.ctx.settings.sweep.server_starts
        if self._tie_break():
            return f"start {self.start_index} (tie-break, [sweep] tie_break_starts)"
        return f"start {self.start_index} of {starts}"

    def _tie_break(self) -> bool:
        """Whether the start now running settles a disagreement ([sweep] tie_break_starts)."""
        return self.start_index is not None and self.start_index > self.ctx.settings.sweep.server_starts

    async def run(self) -> None:
        r = self.result
        server = self._server()
        r.command = server.command_for_record
        r.log_path = str(log_path(self.point.id))
        start = time.perf_counter()
        r.status = "running"
        self.oom_kills_at_start = oom_kills()
        self.save()
        starts = self.ctx.settings.sweep.server_starts
        self.server = server
        try:
            index = 1
            while index == 1 or self._another_start(index):
                if index > 1:
                    r.status = "running"
                    self.save()
                self.start_index = index if starts > 1 else None
                await self._start_and_measure(server if index == 1 else None)
                index += 1
        except ServerStartFailed as exc:
            r.status = ended_status(exc.failure)
            r.failure = exc.failure
            r.command = self.server.command_for_record
        except ReplayError as exc:
            server = self.server
            if not server.alive():
                # It died before the search began (while the corpus was being tokenized, say).
                self._server_died(server)
            else:
                # The server runs but cannot be replayed against (it rejects the key, serves
                # another model, ...): this point failed; the sweep goes on.
                r.status = "failed"
                r.failure = Failure(kind="replay_error", message=str(exc), log_tail=log_tail(server.read_log()))
        except asyncio.CancelledError:
            r.status = "failed"
            r.failure = interrupted()
            raise
        except Exception as exc:  # a bug or an unforeseen answer must cost one point, not the sweep
            r.status = "failed"
            r.failure = Failure(
                kind="planner_error",
                message=f"{type(exc).__name__}: {exc}",
                log_tail=log_tail(traceback.format_exc()),
            )
        finally:
            r.duration_s = round(time.perf_counter() - start, 1)
            self.save()

    async def _start_and_measure(self, server: VllmServer | None) -> None:
        """One start of the point's server (`server`, or a new one) and its search; `self.server`
        is the server as last started, for the failure record."""
        r = self.result
        # A port the launcher chose can be taken by another process before the server binds it:
        # the server is started again on a port chosen afresh (not when [server] port fixes it).
        attempts = 1 if self.ctx.settings.server.port else PORT_ATTEMPTS
        for attempt in range(attempts):
            if attempt or server is None:
                server = self._server()
                r.command = server.command_for_record
            self.server = server
            try:
                async with server:
                    r.capacity = server.capacity
                    if self.start_index in (None, 1):
                        r.startup_s = None if server.startup_s is None else round(server.startup_s, 1)
                    r.vllm_version = server.vllm_version
                    r.command = server.command_for_record
                    await self._measure(server)
                return
            except ServerStartFailed as exc:
                if self.start_index is not None and self.start_index > 1:
                    exc.failure.message = f"{self._start_name()}: {exc.failure.message}"
                note = self._taken_port_note(exc.failure, server)
                if note is None or attempt + 1 == attempts:
                    raise
                r.notes.append(note)

    def _client(self, server: VllmServer, max_connections: int) -> StreamingClient:
        settings = self.ctx.settings
        api_key = settings.server.api_key.get_secret_value() if settings.server.api_key else None
        return settings.replay.client(server.url, model=None, api_key=api_key, max_connections=max_connections)

    async def _search_bound(self, server: VllmServer) -> tuple[int | None, str | None]:
        """The search's ceiling and what set it (None when the server reported no capacity and no
        [replay] max_concurrency caps it).

        Two KV bounds are recorded: concurrency_upper_bound counts every request's blocks
        (replay.prefix.bound.concurrency_upper_bound), concurrency_upper_bound_prefix_cache holds
        blocks that requests share once (prefix_aware_bound). The search starts from the second
        unless the point's args turn vLLM's prefix cache off (--no-enable-prefix-caching)."""
        ctx, r, settings = self.ctx, self.result, self.ctx.settings
        cap = r.capacity
        r.prefix_caching = not has_flag(r.command, "--no-enable-prefix-caching")
        hashes = None
        async with self._client(server, TOKENIZE_WORKERS + 1) as client:
            await client.check()
            if r.prefix_caching and cap.block_size:
                if cap.block_size not in ctx.prompt_blocks:
                    try:
                        counted = await prompt_blocks(client, ctx.corpus.requests, cap.block_size)
                    except ServerError:
                        # A /tokenize without token ids (not vLLM's): counts only, no prefix bound.
                        counted = None
                    if counted is not None:
                        ctx.prompt_blocks[cap.block_size] = [h for _, h in counted]
                        ctx.prompt_tokens = ctx.prompt_tokens or [n for n, _ in counted]
                hashes = ctx.prompt_blocks.get(cap.block_size)
            if ctx.prompt_tokens is None:
                ctx.prompt_tokens = await token_counts(client, ctx.corpus.requests)
        upper, with_cache, limit = None, None, None
        if cap.kv_cache_tokens and cap.block_size:
            max_model_len = cap.max_model_len or self.point.config.get("max_model_len")
            lengths = [
                (p, output_tokens(req, settings, p, max_model_len))
                for req, p in zip(ctx.corpus.requests, ctx.prompt_tokens)
            ]
            r.mean_blocks_per_request = round(
                mean_blocks(lengths, block_size=cap.block_size, max_model_len=max_model_len), 3
            )
            upper = concurrency_upper_bound(
                kv_cache_tokens=cap.kv_cache_tokens,
                block_size=cap.block_size,
                mean_blocks_per_request=r.mean_blocks_per_request,
                max_concurrency_reported=cap.max_concurrency_reported,
            )
            if hashes is not None:
                blocks = [request_blocks(p, o, block_size=cap.block_size, max_model_len=max_model_len) for p, o in lengths]
                shared_n, own, shared = prefix_aware_bound(blocks, hashes, pool_blocks=cap.kv_cache_tokens / cap.block_size)
                r.mean_own_blocks_per_request = round(own, 3)
                r.shared_prefix_blocks = shared
                with_cache = max(upper, shared_n)
            limit = UPPER_BOUND_CONSTRAINT
        cap_n = settings.replay.max_concurrency

        def capped(bound: int | None) -> int | None:
            return cap_n if cap_n is not None and (bound is None or cap_n < bound) else bound

        r.concurrency_upper_bound = capped(upper)
        r.concurrency_upper_bound_prefix_cache = capped(with_cache) if with_cache is not None else None
        ceiling = with_cache if with_cache is not None else upper
        if capped(ceiling) != ceiling:
            limit = "max_concurrency"
        return capped(ceiling), limit

    def _search(self, replay: Replay, upper: int) -> Coroutine[Any, Any, SearchOutcome]:
        """The point's search, capped by the ceiling `upper`. Its first probe is the ceiling itself
        (the cheapest step to measure; the search narrows down from there, replay.search.policy), or
        [replay] start_concurrency when given."""
        start = self.ctx.settings.replay.start_concurrency
        first = upper if start is None else min(start, upper)
        if self.result.plan is not None:
            # [sweep] strategy = "adaptive": verify the class's prediction, or search (planner.sweep.adaptive_point).
            replay_settings = self.ctx.settings.replay
            return planned_search(
                replay, self.result, start=first, upper=upper,
                precision=replay_settings.precision, confirm=replay_settings.confirm_knee,
            )
        return replay.search(start=first, upper=upper)

    async def _measure(self, server: VllmServer) -> None:
        """The search bound and the search, with a watch on the server beside them: a server that
        hangs or whose streams stall ends the point (planner.sweep.liveness), as one that dies does."""
        liveness = Liveness(server, request_timeout_s=self.ctx.settings.replay.request_timeout_s)
        watch = asyncio.create_task(liveness.watch())
        try:
            await self._measure_watched(server, liveness, watch)
        finally:
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch

    async def _measure_watched(self, server: VllmServer, liveness: Liveness, watch: asyncio.Task) -> None:
        ctx, r, settings = self.ctx, self.result, self.ctx.settings
        bound = asyncio.create_task(self._search_bound(server))
        try:
            await asyncio.wait({bound, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not bound.done():
                bound.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bound
        if bound.cancelled():
            self._server_hung(server, watch.result())
            return
        upper, limit = bound.result()
        r.search_upper_bound = upper
        self.save()
        later_start = self.start_index is not None and self.start_index > 1
        if not later_start and upper is not None and settled_by_bound(r, upper, gpus=self.point.gpus, headroom=settings.slo.headroom):
            return  # [sweep] strategy = "adaptive": this point cannot win (planner.sweep.adaptive_point)
        if upper is None:
            r.status = "failed"
            r.failure = Failure(
                kind="no_capacity",
                message="the server reported no KV-cache capacity (log or vllm:cache_config_info), so the"
                " search has no upper bound; set [replay] max_concurrency",
                log_tail=log_tail(server.read_log()),
            )
            return
        def server_pids() -> set[int]:
            return {server.pid} if server.pid is not None else set()

        # GPUs known to nvidia-smi only: a Ray node may declare GPUs it has no nvidia-smi for. The
        # sampler is also the step's GPU probe (planner.gpu_health); the CPUs are watched from /proc.
        monitor: Callable[[], gpu_mod.GpuMemorySampler] | None = (
            (lambda: GpuHealthSampler(list(self.gpu_ids), server_pids=server_pids))
            if self.gpu_ids and ctx.gpu_inventory
            else None
        )
        split = ctx.cpus

        def probes() -> list[WindowProbe]:
            return [CpuProbe(
                server_pids,
                server_cpus=split.server if split is not None else None,
                planner_cpus=split.client if split is not None else None,
            )]

        # A connection for every request in flight at the bound, and spare ones for /metrics.
        async with self._client(server, upper + METRICS_CONNECTIONS) as client:
            replay = Replay(
                client,
                ctx.corpus,
                settings.replay,
                settings.slo.rules(),
                observer=Observers(*ctx.observers, liveness),
                on_step=self._on_step,
                step_monitor=monitor,
                probes=probes,
                server_start=self.start_index,
                # The earlier starts' steps size each closed loop's ramp-up from the first step on.
                known_steps=r.steps,
                prompt_tokens=ctx.prompt_tokens,
            )
            if self._tie_break():
                # The starts disagree: this one searches on its own steps, from the highest of their
                # knees down; one pass there is its answer (replay.search.pass_fit.majority_knee).
                top = max(k for k in (r.start_knees or {}).values() if k is not None)
                search = asyncio.create_task(replay.search(start=top, upper=top, confirm=False))
            elif later_start:
                # The earlier starts' steps, pooled: the search goes on from them (replay.search.policy).
                replay.steps = list(r.steps)
                search = asyncio.create_task(replay.search(start=upper, upper=upper, pooled=len(r.steps)))
            else:
                search = asyncio.create_task(self._search(replay, upper))
            died = asyncio.create_task(server.wait_exit())
            server_died = False
            try:
                await asyncio.wait({search, died, watch}, return_when=asyncio.FIRST_COMPLETED)
                server_died = died.done()
                if server_died:
                    # Let the step in flight wind down on its own; its requests fail fast now.
                    replay.abort.set()
                    with contextlib.suppress(StepAborted):
                        await search
                # A hung server's requests would wait out their timeouts: the step in flight is
                # dropped at once (cancelled below), as a dead server's is.
            finally:
                for task in (search, died):
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
            if server_died or not server.alive():
                self._server_died(server)
                return
            if search.cancelled():
                self._server_hung(server, watch.result())
                return
            outcome = search.result()
        if self._tie_break():
            # Its own search's bracket is one start's: the point's is every start's, pooled.
            budget_exhausted = r.budget_exhausted or outcome.budget_exhausted
            outcome = pooled_outcome(r.steps)
            outcome.budget_exhausted = budget_exhausted
        r.unresolved_concurrency = outcome.unresolved
        r.disturbed_concurrency = outcome.disturbed
        r.interference_allowed = settings.replay.allow_interference
        r.budget_exhausted = outcome.budget_exhausted
        conclude(
            r,
            outcome.max_passing,
            outcome.min_failing,
            upper=upper,
            limit=limit,
            gpus=self.point.gpus,
            headroom=settings.slo.headroom,
            gpu_totals_mib={g.index: g.memory_total_mib for g in ctx.gpu_inventory},
            knee_level=settings.replay.knee_pass_probability,
        )
        if (lost := metrics_lost(r.steps)) is not None:
            note, unchecked = lost
            r.notes.append(note)
            if unchecked:
                # The verdict rests on SLOs that went unchecked from that step on.
                r.status = "failed"
                r.failure = Failure(
                    kind="metrics_lost", message=f"{note}; the SLOs {', '.join(unchecked)} need them and went unchecked"
                )

    def _server_died(self, server: VllmServer) -> None:
        self.result.status = "failed"
        self.result.failure = death(server, self.oom_kills_at_start)
        self.result.max_passing_concurrency = bracket(concurrency_history(self.result.steps)).max_passing

    def _server_hung(self, server: VllmServer, failure: Failure) -> None:
        """The watch saw the server hang or its streams stall: the point ends there, with the steps
        measured before; the server is stopped on the way out (resumed first if it was stopped,
        so that SIGTERM reaches it rather than waiting for the SIGKILL after stop_grace_s)."""
        if server.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.pgid, signal.SIGCONT)
        self.result.status = "failed"
        self.result.failure = failure
        self.result.max_passing_concurrency = bracket(concurrency_history(self.result.steps)).max_passing
