"""The sweep: for every grid point start vLLM, read its capacity, search the highest concurrency
that passes the SLOs, and keep what was measured in sweep.json as it goes."""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from planner import cpus as cpus_mod
from planner import gpus as gpu_mod
from planner.capacity import Failure
from planner.errors import ConfigError
from planner.launcher import ServerStartFailed, VllmServer
from planner.sweep.bound import concurrency_upper_bound, mean_blocks
from planner.sweep.config import SweepSettings, public_settings
from planner.sweep.grid import Point, expand, fingerprint
from planner.sweep.observer import SweepObserver, SweepObservers
from planner.sweep.outcome import UPPER_BOUND_CONSTRAINT, choose_best, output_tokens_per_s_at, safe_concurrency
from planner.sweep.results import INFEASIBLE_KINDS, CorpusInfo, PointResult, RunInfo, SweepResults
from planner.estimate import Estimate, kv_tokens_relative_error
from planner.sweep.predict import NotPredicted, should_skip
from planner.sweep.version import probe_version
from planner.vllm_log import log_tail
from replay.client import StreamingClient
from replay.corpus import Corpus
from replay.errors import ReplayError, StepAborted
from replay.observer import Observers
from replay.results import StepResult, write_json_atomic
from replay.search import bracket
from replay.session import Replay, binding_constraint, concurrency_history, knee
from replay.tokens import TOKENIZE_WORKERS, token_counts

if TYPE_CHECKING:
    from planner.sweep.ray_executor import RayCluster

RESULTS_FILE = "sweep.json"
FINISHED = {"ok", "infeasible", "predicted_infeasible"}
# vLLM completions' default max_tokens, used to size requests that ask for none.
VLLM_DEFAULT_MAX_TOKENS = 16
# Spare connections beside the load's, so /metrics scrapes never wait for a request to finish.
METRICS_CONNECTIONS = 4


@dataclass
class SweepContext:
    settings: SweepSettings
    corpus: Corpus
    output_dir: Path
    results: SweepResults
    observers: list[SweepObserver] = field(default_factory=list)
    gpu_inventory: list[gpu_mod.Gpu] = field(default_factory=list)
    # Token counts depend only on the model's tokenizer: measured once, shared by every point.
    prompt_tokens: list[int] | None = None
    # The server's and the planner's CPUs when [cpus] client pins them apart.
    cpus: cpus_mod.CpuSplit | None = None

    def save(self) -> None:
        write_json_atomic(self.output_dir / RESULTS_FILE, self.results.model_dump(mode="json"))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def previous_results(output_dir: Path) -> dict[str, PointResult]:
    """Finished points of an earlier run in the same folder, by fingerprint."""
    path = output_dir / RESULTS_FILE
    if not path.exists():
        return {}
    try:
        earlier = SweepResults.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path}: cannot resume from it: {exc}") from None
    return {p.fingerprint: p for p in earlier.points if p.status in FINISHED}


def _output_tokens(req, settings: SweepSettings, prompt_tokens: int, max_model_len: int | None) -> int:
    if req.max_tokens is not None:
        return req.max_tokens
    if settings.replay.max_tokens is not None:
        return settings.replay.max_tokens
    if settings.replay.api == "chat" and max_model_len is not None:
        # Chat without max_tokens may generate up to the rest of the context.
        return max(0, max_model_len - prompt_tokens)
    return VLLM_DEFAULT_MAX_TOKENS


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


class PointRunner:
    def __init__(self, ctx: SweepContext, point: Point, result: PointResult, gpu_ids: tuple[str, ...]) -> None:
        self.ctx = ctx
        self.point = point
        self.result = result
        self.gpu_ids = gpu_ids

    def _on_step(self, step: StepResult) -> None:
        self.result.steps.append(step)
        self.ctx.save()

    def _server(self) -> VllmServer:
        return point_server(
            self.ctx.settings,
            self.point,
            log_path=self.ctx.output_dir / "points" / self.point.id / "server.log",
            gpu_ids=self.gpu_ids,
            port=self.ctx.settings.server.port or None,
            cpus=self.ctx.cpus,
        )

    async def run(self) -> None:
        r = self.result
        server = self._server()
        r.command = server.command_for_record
        r.log_path = str(Path("points") / self.point.id / "server.log")
        start = time.perf_counter()
        r.status = "running"
        self.ctx.save()
        try:
            async with server:
                r.capacity = server.capacity
                r.vllm_version = server.vllm_version
                r.command = server.command_for_record
                await self._measure(server)
        except ServerStartFailed as exc:
            r.status = "infeasible" if exc.failure.kind in INFEASIBLE_KINDS else "failed"
            r.failure = exc.failure
            r.command = server.command_for_record
        except ReplayError as exc:
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
            r.failure = Failure(kind="interrupted", message="the sweep was interrupted during this point")
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
            self.ctx.save()

    def _client(self, server: VllmServer, max_connections: int) -> StreamingClient:
        settings = self.ctx.settings
        return StreamingClient(
            server.url,
            model=None,
            api=settings.replay.api,
            api_key=settings.server.api_key.get_secret_value() if settings.server.api_key else None,
            max_connections=max_connections,
            request_timeout_s=settings.replay.request_timeout_s,
            ignore_eos=settings.replay.ignore_eos,
            default_max_tokens=settings.replay.max_tokens,
            extra_body=settings.replay.extra_body,
        )

    async def _search_bound(self, server: VllmServer) -> tuple[int | None, str | None]:
        """The search's ceiling and what set it (None when the server reported no capacity and no
        [replay] max_concurrency caps it)."""
        ctx, r, settings = self.ctx, self.result, self.ctx.settings
        cap = r.capacity
        async with self._client(server, TOKENIZE_WORKERS + 1) as client:
            await client.check()
            if ctx.prompt_tokens is None:
                ctx.prompt_tokens = await token_counts(client, ctx.corpus.requests)
        upper, limit = None, None
        if cap.kv_cache_tokens and cap.block_size:
            max_model_len = cap.max_model_len or self.point.config.get("max_model_len")
            lengths = [
                (p, _output_tokens(req, settings, p, max_model_len))
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
            limit = UPPER_BOUND_CONSTRAINT
        cap_n = settings.replay.max_concurrency
        if cap_n is not None and (upper is None or cap_n < upper):
            upper, limit = cap_n, "max_concurrency"
        return upper, limit

    async def _measure(self, server: VllmServer) -> None:
        ctx, r, settings = self.ctx, self.result, self.ctx.settings
        upper, limit = await self._search_bound(server)
        r.concurrency_upper_bound = upper
        ctx.save()
        if upper is None:
            r.status = "failed"
            r.failure = Failure(
                kind="no_capacity",
                message="the server reported no KV-cache capacity (log or vllm:cache_config_info), so the"
                " search has no upper bound; set [replay] max_concurrency",
                log_tail=log_tail(server.read_log()),
            )
            return
        # GPUs known to nvidia-smi only: a Ray node may declare GPUs it has no nvidia-smi for.
        monitor: Callable[[], gpu_mod.GpuMemorySampler] | None = (
            (lambda: gpu_mod.GpuMemorySampler(list(self.gpu_ids))) if self.gpu_ids and ctx.gpu_inventory else None
        )
        # A connection for every request in flight at the bound, and spare ones for /metrics.
        async with self._client(server, upper + METRICS_CONNECTIONS) as client:
            replay = Replay(
                client,
                ctx.corpus,
                settings.replay,
                settings.slo.rules(),
                observer=Observers(*ctx.observers),
                on_step=self._on_step,
                step_monitor=monitor,
            )
            # The first probe is the bound itself: the cheapest step to measure, and the search
            # narrows down from there (replay.search).
            first = upper if settings.replay.start_concurrency is None else min(settings.replay.start_concurrency, upper)
            search = asyncio.create_task(replay.search(start=first, upper=upper))
            died = asyncio.create_task(server.wait_exit())
            server_died = False
            try:
                await asyncio.wait({search, died}, return_when=asyncio.FIRST_COMPLETED)
                server_died = died.done()
                if server_died:
                    # Let the step in flight wind down on its own; its requests fail fast now.
                    replay.abort.set()
                    with contextlib.suppress(StepAborted):
                        await search
            finally:
                for task in (search, died):
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
            if server_died or not server.alive():
                self._server_died(server)
                return
            outcome = search.result()
        self.result.unresolved_concurrency = outcome.unresolved
        self.result.budget_exhausted = outcome.budget_exhausted
        self._conclude(outcome.max_passing, outcome.min_failing, upper, limit)

    def _server_died(self, server: VllmServer) -> None:
        self.result.status = "failed"
        self.result.failure = Failure(
            kind="server_died",
            message=f"the server exited with code {server.exit_code} during the replay",
            exit_code=server.exit_code,
            log_tail=log_tail(server.read_log()),
        )
        self.result.max_passing_concurrency = bracket(concurrency_history(self.result.steps)).max_passing

    def _conclude(self, lo: int | None, hi: int | None, upper: int, limit: str | None) -> None:
        r, settings = self.result, self.ctx.settings
        r.status = "ok"
        r.max_passing_concurrency = lo
        r.min_failing_concurrency = hi
        r.binding_constraint = binding_constraint(r.steps, hi, limit if hi is None and lo == upper else None)
        r.confirmed, r.knee_interval = knee(r.steps)
        r.safe_concurrency = safe_concurrency(lo, settings.slo.headroom)
        gpus = self.point.gpus
        r.gpus = gpus
        if r.safe_concurrency is not None:
            r.safe_concurrency_per_gpu = round(r.safe_concurrency / gpus, 3)
            tps = output_tokens_per_s_at(r.steps, r.safe_concurrency)
            r.output_tokens_per_s_per_gpu = None if tps is None else round(tps / gpus, 2)
        peaks: dict[str, float] = {}
        for step in r.steps:
            for gpu, mib in (step.gpu_memory_peak_mib or {}).items():
                peaks[gpu] = max(peaks.get(gpu, 0.0), mib)
        if peaks:
            r.gpu_memory_peak_mib = peaks
            totals = {g.index: g.memory_total_mib for g in self.ctx.gpu_inventory}
            r.gpu_memory_headroom_mib = {g: totals[g] - v for g, v in peaks.items() if g in totals}


def _reusable(earlier: PointResult, *, prune: bool) -> bool:
    """A finished point --resume keeps. Not one the estimate skipped when pruning is now off, nor
    one refused for want of GPUs here (the planner's limit, not the configuration's)."""
    if earlier.status == "predicted_infeasible" and not prune:
        return False
    return not (
        earlier.failure is not None
        and earlier.failure.kind in ("world_size_too_large", "not_enough_gpus")
        and not earlier.command
    )


def _new_result(point: Point, fp: str) -> PointResult:
    return PointResult(
        id=point.id,
        config=point.config,
        command=[],
        status="pending",
        fingerprint=fp,
        gpus=point.gpus,
    )


def _too_many_gpus(point: Point, available: int) -> Failure:
    return Failure(
        kind="world_size_too_large",
        message=f"the point needs {point.gpus} GPUs (tensor x pipeline parallel) but {available} are available",
    )


def _one_machine(point: Point) -> Failure:
    return Failure(
        kind="not_enough_gpus",
        message=f"the point spreads vLLM over {point.nnodes} nodes (nnodes = {point.nnodes}) and a local sweep has"
        " one machine; run it on a Ray cluster ([executor] kind = \"ray\", or --executor ray)",
    )


async def _run_point(ctx: SweepContext, point: Point, result: PointResult, gpu_ids: tuple[str, ...]) -> None:
    observer = SweepObservers(*ctx.observers)
    observer.point_started(point.id, point.config, ctx.settings.server.model)
    result.started_at = _now()
    result.gpu_ids = list(gpu_ids)
    models = sorted({g.name for g in ctx.gpu_inventory if g.index in gpu_ids})
    result.gpu_model = ", ".join(models) or result.gpu_model
    try:
        await PointRunner(ctx, point, result, gpu_ids).run()
    finally:
        observer.point_finished(point.id, result.safe_concurrency_per_gpu)


async def run_sweep(
    settings: SweepSettings,
    corpus: Corpus,
    *,
    output_dir: Path,
    resume: bool = False,
    observers: list[SweepObserver] | None = None,
    predict: Callable[[Point, list], Estimate | NotPredicted | None] | None = None,
    cpus: cpus_mod.CpuSplit | None = None,
) -> SweepResults:
    """Run every point of the grid (or reuse it with --resume) and choose the best."""
    if settings.executor.kind == "local":
        return await _sweep(settings, corpus, Path(output_dir), resume, observers, predict, cpus, cluster=None)
    # Imported here: Ray is an optional extra that a local sweep never needs.
    from planner.sweep.ray_executor import RayCluster

    cluster = RayCluster.connect(settings.executor)
    try:
        return await _sweep(settings, corpus, Path(output_dir), resume, observers, predict, cpus, cluster=cluster)
    finally:
        cluster.close()


async def _sweep(
    settings: SweepSettings,
    corpus: Corpus,
    output_dir: Path,
    resume: bool,
    observers: list[SweepObserver] | None,
    predict: Callable[[Point, list], Estimate | NotPredicted | None] | None,
    cpus: cpus_mod.CpuSplit | None,
    *,
    cluster: RayCluster | None,
) -> SweepResults:
    points = expand(settings)
    version = await asyncio.to_thread(probe_version, settings.server.command, settings.server.env)
    # On a cluster, this machine's GPUs are not the ones points run on.
    inventory = gpu_mod.discover(settings.gpus.devices) if cluster is None else []
    earlier = previous_results(output_dir) if resume else {}
    run = RunInfo(
        corpus=CorpusInfo(path=str(corpus.path), sha256=corpus.sha256, requests=len(corpus)),
        vllm_version=version,
        gpus_found=[g.index for g in inventory],
        cpus_split=None if cpus is None else {"server": list(cpus.server), "client": list(cpus.client)},
    )
    ctx = SweepContext(
        settings=settings,
        corpus=corpus,
        output_dir=output_dir,
        results=SweepResults(started_at=_now(), settings=public_settings(settings), run=run),
        observers=list(observers or []),
        gpu_inventory=inventory,
        cpus=cpus,
    )
    todo: list[tuple[Point, PointResult]] = []
    for point in points:
        fp = fingerprint(settings, point, corpus_sha256=corpus.sha256, vllm_version=version)
        if fp in earlier and _reusable(earlier[fp], prune=settings.estimate.prune):
            reused = earlier[fp].model_copy(update={"id": point.id, "config": point.config})
            ctx.results.points.append(reused)
            continue
        result = _new_result(point, fp)
        ctx.results.points.append(result)
        if cluster is None and point.nnodes > 1:
            result.status, result.failure = "infeasible", _one_machine(point)
            continue
        if inventory and point.gpus > len(inventory):
            result.status, result.failure = "infeasible", _too_many_gpus(point, len(inventory))
            continue
        if cluster is not None and (unplaceable := cluster.unplaceable(point)) is not None:
            result.status, result.failure = "infeasible", unplaceable
            continue
        if predict is not None:
            prediction = predict(point, inventory)
            if prediction is not None:
                result.prediction = prediction.model_dump(mode="json")
            if isinstance(prediction, Estimate):
                result.kv_cache_tokens_predicted = prediction.kv_cache_tokens
                why = should_skip(prediction.verdict, prune=settings.estimate.prune)
                if why is not None:
                    result.status = "predicted_infeasible"
                    result.failure = Failure(
                        kind="predicted_infeasible",
                        message=why,
                        estimated_max_model_len=prediction.verdict.largest_fitting_max_model_len,
                    )
                    continue
        todo.append((point, result))
    ctx.save()

    try:
        if cluster is not None:
            await cluster.run(ctx, todo)
            return ctx.results
        waves = gpu_mod.plan_placement([p.gpus for p, _ in todo], [g.index for g in inventory])
        if settings.server.port:
            # One fixed port (a container's published port, say) carries one server at a time.
            waves = [[placement] for wave in waves for placement in wave]
        for wave in waves:
            await asyncio.gather(
                *(_run_point(ctx, todo[pl.point][0], todo[pl.point][1], pl.gpu_ids) for pl in wave)
            )
            for _, result in (todo[pl.point] for pl in wave):
                _record_prediction_error(result)
    except asyncio.CancelledError:
        ctx.results.interrupted = True
        raise
    finally:
        ctx.results.best = choose_best(ctx.results.points)
        ctx.save()
    return ctx.results


def _record_prediction_error(result: PointResult) -> None:
    result.kv_cache_tokens_relative_error = kv_tokens_relative_error(
        result.kv_cache_tokens_predicted, result.capacity.kv_cache_tokens
    )
