"""`planner replay`: the loads checked against the corpus, one client sized for them, the server
checked, the runner driven (the planned loads, then the search), and the results saved after
every step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from replay.client.streaming import METRICS_CONNECTIONS
from replay.corpus.jsonl import Corpus
from replay.errors import ReplayError
from replay.identity import Identity, measured_identity, served_model_files
from replay.results import CorpusInfo, ReplayResults, StepResult, write_json_atomic
from replay.run.runner import Replay, StepMonitor, planned_loads, search_start
from replay.run.settings import ReplaySettings
from replay.search.binding import binding
from replay.search.verdicts import knee, knee_fields
from replay.step.environment import WindowProbe
from replay.step.observer import ReplayObserver

RESULTS_FILE = "replay.json"
# Connection pool size when the highest concurrency is not known in advance.
SEARCH_MAX_CONNECTIONS = 4096


def check_loads(settings: ReplaySettings, corpus: Corpus) -> None:
    """A clear error before any load when there is nothing to run, or a trace without timestamps."""
    if not planned_loads(settings) and not settings.find_max:
        raise ReplayError("nothing to run: give --concurrency, --rate, --trace or --find-max")
    if settings.trace and not corpus.has_timestamps:
        if corpus.sessions is not None:
            missing = next(s.turns[0] for s in corpus.sessions if s.timestamp_s is None)
            raise ReplayError(
                f"--trace needs timestamp_s on every session's first turn; {corpus.path}:{missing.line} has none"
            )
        missing = next(r for r in corpus.requests if r.timestamp_s is None)
        raise ReplayError(
            f"--trace needs timestamp_s on every corpus line; {corpus.path}:{missing.line} has none"
        )


def pool_size(settings: ReplaySettings) -> int:
    """Connections for the client: the highest concurrency when it is known in advance (else
    SEARCH_MAX_CONNECTIONS), plus spare ones so /metrics scrapes never wait for a request."""
    known = max([settings.max_concurrency or 0, *settings.concurrency])
    open_loop = bool(settings.rate) or settings.trace
    unknown = open_loop or (settings.find_max and not settings.max_concurrency)
    max_connections = SEARCH_MAX_CONNECTIONS if unknown else known
    return max(max_connections + METRICS_CONNECTIONS, 1)


def corpus_info(corpus: Corpus) -> CorpusInfo:
    return CorpusInfo(
        path=str(corpus.path),
        sha256=corpus.sha256,
        requests=len(corpus),
        skipped_invalid=corpus.skipped_invalid,
        sessions=None if corpus.sessions is None else len(corpus.sessions),
    )


async def find_max(replay: Replay, settings: ReplaySettings, results: ReplayResults, save) -> None:
    """`--find-max`: the search from its start, and its answer into the results."""
    start, results.search_start_reason = await search_start(replay, settings)
    results.search_start = start
    save()
    outcome = await replay.search(start=start, upper=settings.max_concurrency)
    lo, hi = outcome.max_passing, outcome.min_failing
    results.max_passing_concurrency = lo
    results.min_failing_concurrency = hi
    results.unresolved_concurrency = outcome.unresolved
    results.disturbed_concurrency = outcome.disturbed
    results.budget_exhausted = outcome.budget_exhausted
    cap = "max_concurrency" if hi is None and settings.max_concurrency else None
    bound_by = binding(replay.steps, hi, cap)
    results.binding_constraint, results.binding_undecided = bound_by.constraint, bound_by.undecided
    results.confirmed, results.knee_interval = knee(replay.steps)
    for name, value in knee_fields(replay.steps, settings.knee_pass_probability).items():
        setattr(results, name, value)


async def run_replay(
    *,
    url: str,
    corpus: Corpus,
    settings: ReplaySettings,
    slo: dict[str, float],
    model: str | None = None,
    api_key: str | None = None,
    output_dir: Path | None = None,
    observer: ReplayObserver | None = None,
    identity: Identity | None = None,
    probes: Callable[[], list[WindowProbe]] | None = None,
    step_monitor: Callable[[], StepMonitor] | None = None,
) -> ReplayResults:
    """`planner replay`: the planned loads, then the search when `settings.find_max`.

    `identity` is what the caller knows of the server (the model's files, the hardware); the
    server's version, the served model, the corpus and the SLOs are filled in here. `probes`
    makes what each step's window watches (replay.step.environment; default: the CPUs, with the
    server's processes unknown); `step_monitor` runs around each step (the local server's GPU
    sampler, planner.gpu_health, which is also a probe)."""
    check_loads(settings, corpus)
    async with settings.client(url, model=model, api_key=api_key, max_connections=pool_size(settings)) as client:
        served = await client.check()
        known = served_model_files(identity or Identity(), served)
        results = ReplayResults(
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            url=url,
            model=served,
            api=settings.api,
            corpus=corpus_info(corpus),
            settings=settings.model_dump(mode="json"),
            slo=slo,
            identity=measured_identity(
                known,
                served=served,
                vllm_version=None if known.vllm_version else await client.version(),
                corpus_sha256=corpus.sha256,
                slo=slo,
            ),
            find_max=settings.find_max,
            interference_allowed=settings.allow_interference,
            concurrency_unit="sessions" if corpus.sessions is not None else None,
        )

        def save(_: StepResult | None = None) -> None:
            results.steps = list(replay.steps)
            if output_dir is not None:
                write_json_atomic(Path(output_dir) / RESULTS_FILE, results.model_dump(mode="json"))

        replay = Replay(
            client, corpus, settings, slo, observer=observer, on_step=save, probes=probes, step_monitor=step_monitor
        )
        save()
        try:
            await replay.run_planned()
            if settings.find_max:
                await find_max(replay, settings, results, save)
        except (asyncio.CancelledError, KeyboardInterrupt):
            results.interrupted = True
            raise
        finally:
            save()
        return results
