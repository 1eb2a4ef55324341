"""The sweep: plan the grid (reuse what --resume may, refuse what cannot run, skip what the
estimate rules out), hand the rest to an executor (planner.sweep.executor: this machine or a Ray
cluster, from [executor] kind), and choose the best point. sweep.json is rewritten as points change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from planner import cpus as cpus_mod
from planner.capacity import Failure
from planner.errors import ServerStartFailed
from planner.estimate import Estimate
from planner.identity import server_identity
from planner.sweep.adaptive import finish, record_classes, run_adaptive
from planner.sweep.config import SweepSettings, public_settings
from planner.sweep.earlier import keep_partial, read_earlier, remove_stale_temporaries, set_aside
from planner.sweep.executor import Executor, SweepContext, Todo
from planner.sweep.grid import Point, expand, fingerprint
from planner.sweep.local import LocalExecutor
from planner.sweep.lock import SweepLock
from planner.sweep.observer import SweepObserver
from planner.sweep.outcome import choose_best
from planner.sweep.point import PointContext, now
from planner.sweep.predict import should_skip
from planner.sweep.results import (
    RESULTS_FILE, CorpusInfo, CpuSplitInfo, FreshServerCheck, NotPredicted, PointResult, RunInfo, SweepResults,
)
from planner.sweep.version import probe_version
from replay.corpus.jsonl import Corpus
from replay.errors import ReplayError

FINISHED = {"ok", "infeasible", "predicted_infeasible", "dominated", "predicted"}


def previous_results(output_dir: Path) -> dict[str, PointResult]:
    """Finished points of an earlier run in the same folder, by fingerprint (planner.sweep.earlier
    says in one line why a file cannot be read)."""
    earlier = read_earlier(output_dir / RESULTS_FILE)
    if earlier is None:
        return {}
    return {p.fingerprint: p for p in earlier.points if p.status in FINISHED}


def reusable(earlier: PointResult, *, prune: bool, adaptive: bool = False) -> bool:
    """A finished point --resume keeps. Not one the estimate skipped when pruning is now off, nor
    one the adaptive strategy settled unsearched when it is now off, nor one refused for want of
    GPUs here (the planner's limit, not the configuration's)."""
    if earlier.status == "predicted_infeasible" and not prune:
        return False
    if earlier.status in ("dominated", "predicted") and not adaptive:
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


async def run_sweep(
    settings: SweepSettings,
    corpus: Corpus,
    *,
    output_dir: Path,
    resume: bool = False,
    observers: list[SweepObserver] | None = None,
    predict: Callable[[Point, list], Estimate | NotPredicted | None] | None = None,
    cpus: cpus_mod.CpuSplit | None = None,
    restart: bool = False,
) -> SweepResults:
    """Run every point of the grid (or reuse it with --resume) and choose the best. One sweep at a
    time writes into `output_dir` (planner.sweep.lock); without --resume, its earlier sweep.json is
    moved aside (planner.sweep.earlier), never overwritten."""
    output_dir = Path(output_dir)
    with SweepLock(output_dir):
        remove_stale_temporaries(output_dir / RESULTS_FILE)
        if resume:
            if (earlier := read_earlier(output_dir / RESULTS_FILE)) is not None:
                keep_partial(output_dir / RESULTS_FILE, earlier, FINISHED)
        else:
            # Nothing measured is overwritten: an earlier sweep.json is moved aside.
            set_aside(output_dir / RESULTS_FILE, restart=restart)
        executor = _executor(settings)
        try:
            return await _sweep(settings, corpus, output_dir, resume, observers, predict, cpus, executor)
        finally:
            executor.close()


def _executor(settings: SweepSettings) -> Executor:
    match settings.executor.kind:
        case "local":
            return LocalExecutor(settings)
        case "ray":
            # Imported here: Ray is an optional extra that a local sweep never needs.
            from planner.sweep.ray_driver import RayExecutor

            return RayExecutor.connect(settings.executor)


async def _sweep(
    settings: SweepSettings,
    corpus: Corpus,
    output_dir: Path,
    resume: bool,
    observers: list[SweepObserver] | None,
    predict: Callable[[Point, list], Estimate | NotPredicted | None] | None,
    cpus: cpus_mod.CpuSplit | None,
    executor: Executor,
) -> SweepResults:
    points = expand(settings)
    version = await asyncio.to_thread(probe_version, settings.server.command, settings.server.env)
    inventory = executor.inventory()
    earlier = previous_results(output_dir) if resume else {}
    run = RunInfo(
        corpus=CorpusInfo(path=str(corpus.path), sha256=corpus.sha256, requests=len(corpus)),
        vllm_version=version,
        gpus_found=[g.index for g in inventory],
        cpus_split=None if cpus is None else CpuSplitInfo(server=list(cpus.server), client=list(cpus.client)),
    )
    server = settings.server
    identity = await asyncio.to_thread(
        server_identity,
        command=server.command,
        model=server.model,
        args=server.args,
        env=server.env,
        secrets=[server.api_key.get_secret_value()] if server.api_key else [],
        vllm_version=version,
        corpus_sha256=corpus.sha256,
        slo=settings.slo.rules(),
        use_gpus=settings.gpus.devices != "none",
    )
    ctx = SweepContext(
        shared=PointContext(
            settings=settings,
            corpus=corpus,
            output_dir=output_dir,
            observers=list(observers or []),
            gpu_inventory=inventory,
            cpus=cpus,
        ),
        results=SweepResults(started_at=now(), settings=public_settings(settings), run=run, identity=identity),
    )
    todo: Todo = []
    for point in points:
        fp = fingerprint(settings, point, corpus_sha256=corpus.sha256, vllm_version=version)
        if fp in earlier and reusable(earlier[fp], prune=settings.estimate.prune, adaptive=settings.sweep.strategy == "adaptive"):
            reused = earlier[fp].model_copy(update={"id": point.id, "config": point.config})
            ctx.results.points.append(reused)
            continue
        result = _new_result(point, fp)
        ctx.results.points.append(result)
        if (unplaceable := executor.unplaceable(point)) is not None:
            result.status, result.failure = "infeasible", unplaceable
            continue
        if predict is not None:
            prediction = predict(point, inventory)
            if prediction is not None:
                result.prediction = prediction
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
    if identity.model.revision is None:
        # A Hub name without @revision: the commit the estimate read it at, when it did.
        read_at = next((p.prediction.model.revision for p in ctx.results.points if isinstance(p.prediction, Estimate)), None)
        identity = identity.model_copy(update={"model": identity.model.model_copy(update={"revision": read_at})})
        ctx.results.identity = identity
    classes = record_classes(ctx.results, points, settings)
    ctx.save()

    try:
        if settings.sweep.strategy == "adaptive":
            slots = max(1, len(inventory)) if settings.executor.kind == "local" and not settings.server.port else 1
            await run_adaptive(executor, ctx, todo, grid=points, classes=classes, corpus=corpus, slots=slots)
        else:
            await executor.run(ctx, todo)
    except asyncio.CancelledError:
        ctx.results.interrupted = True
        raise
    finally:
        finish(ctx.results)
        ctx.results.best = choose_best(ctx.results.points)
        if identity.vllm_version is None:
            # A container's command cannot be asked beforehand; its servers said it.
            said = next((p.vllm_version for p in ctx.results.points if p.vllm_version), None)
            ctx.results.identity = identity.model_copy(update={"vllm_version": said})
        ctx.save()
    await _confirm_best(settings, ctx, points, executor)
    return ctx.results


async def _confirm_best(settings: SweepSettings, ctx: SweepContext, points: list[Point], executor: Executor) -> None:
    """[sweep] confirm_fresh_server: the recommended point once more on a fresh server."""
    best = ctx.results.best
    if best is None or not settings.sweep.confirm_fresh_server:
        return
    result = next(p for p in ctx.results.points if p.id == best.point_id)
    point = next((p for p in points if p.id == best.point_id), None)
    if point is None:
        return
    if point.nnodes > 1:
        ctx.results.fresh_server = FreshServerCheck(
            point_id=best.point_id, concurrency=result.safe_concurrency or 0,
            note="the fresh-server confirmation runs one-node points only; this one spans nodes",
        )
    else:
        ctx.results.fresh_server = FreshServerCheck(point_id=best.point_id, concurrency=result.safe_concurrency or 0)
        try:
            ctx.results.fresh_server = await executor.confirm_fresh(ctx, point, result)
        except ServerStartFailed as exc:
            ctx.results.fresh_server.note = f"the fresh server did not start: {exc.failure.message}"
        except ReplayError as exc:
            ctx.results.fresh_server.note = f"the fresh server could not be measured: {exc}"
    ctx.save()
