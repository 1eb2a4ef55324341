"""A whole replay: check the server, run the steps (a fixed list or the search), save as it goes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from replay import pass_fit
from replay.across_steps import spread_of
from replay.client import METRICS_CONNECTIONS, StreamingClient
from replay.conversation import SessionCursor, ThinkTime, mean_think_per_request_s, turn_request
from replay.corpus import Corpus
from replay.eta import search_eta_s
from replay.errors import ReplayError, StepAborted
from replay import slo as slo_mod
from replay.load import Concurrency, Load, PoissonRate, TraceReplay
from replay.observer import ReplayObserver
from replay.identity import Identity, model_config_facts, model_fingerprint
from replay.results import CorpusInfo, ReplayResults, StepResult, write_json_atomic
from replay.saturation import first_probe, saturation_probe
from replay.search import Probe, bracket, is_confirmed, knee_interval, next_probe, unresolved
from replay.server_metrics import MetricsScraper
from replay.settings import ReplaySettings
from replay.step import RequestCursor, Window, run_step


class StepMonitor(Protocol):
    """Runs around each step (the sweep samples GPU memory with one); `peak_mib` is copied into
    the step's gpu_memory_peak_mib."""

    peak_mib: dict[str, float]

    async def __aenter__(self) -> object: ...

    async def __aexit__(self, *exc: object) -> None: ...

RESULTS_FILE = "replay.json"
# Connection pool size when the highest concurrency is not known in advance.
SEARCH_MAX_CONNECTIONS = 4096


def planned_loads(settings: ReplaySettings) -> list[Load]:
    loads: list[Load] = [Concurrency(n) for n in settings.concurrency]
    loads += [PoissonRate(r, settings.seed + i) for i, r in enumerate(settings.rate)]
    if settings.trace:
        loads.append(TraceReplay(settings.trace_speed))
    return loads


def binding_constraint(steps: list[StepResult], min_failing: int | None, reached_cap: str | None) -> str | None:
    """What stopped the search: the SLOs the lowest failing step broke, or the cap it hit."""
    if min_failing is not None:
        for step in steps:
            if step.load.mode == "concurrency" and int(step.load.value) == min_failing and not step.slo_pass:
                return ",".join(step.slo_violations) or None
    return reached_cap


def probe_of(step: StepResult, slo: dict[str, float] | None = None) -> Probe:
    """A closed-loop step as the search sees it: its verdict (an inconclusive step did not pass;
    steps without a verdict, from older files, count by slo_pass) and, with the SLOs, each rule's
    measured / bound."""
    verdict = step.slo_verdict or ("pass" if step.slo_pass else "fail")
    return Probe(int(step.load.value), verdict, slo_mod.ratios(step, slo) if slo else {})


def concurrency_history(steps: list[StepResult], slo: dict[str, float] | None = None) -> list[Probe]:
    """Every closed-loop step, in order, as the search sees it."""
    return [probe_of(s, slo) for s in steps if s.load.mode == "concurrency"]


def knee(steps: list[StepResult]) -> tuple[bool, list[int | None]]:
    """Whether the highest pass below the lowest failure passed twice, and the knee interval
    [highest conclusive pass, lowest conclusive fail]. Steps without a verdict (older files)
    count by slo_pass."""
    history = concurrency_history(steps)
    lo = bracket(history).max_passing
    verdicts = [
        (int(s.load.value), s.slo_verdict or ("pass" if s.slo_pass else "fail"))
        for s in steps
        if s.load.mode == "concurrency"
    ]
    return (lo is not None and is_confirmed(history, lo)), knee_interval(verdicts)


def knee_fields(steps: list[StepResult], level: float = pass_fit.DEFAULT_LEVEL) -> dict[str, object]:
    """The result fields of the knee read from every step (replay.pass_fit)."""
    fitted = pass_fit.fit(steps, level)
    return {
        "knee_fit": fitted.knee_fit,
        "knee_fit_level": level,
        "knee_band": fitted.knee_band,
        "contested_concurrency": fitted.contested,
        "pass_probability": fitted.points,
    }


class Replay:
    """Runs steps against one server with one client and one corpus cursor.

    The sweep drives it too: `search()` with the capacity bound as `upper`.
    """

    def __init__(
        self,
        client: StreamingClient,
        corpus: Corpus,
        settings: ReplaySettings,
        slo: dict[str, float],
        *,
        observer: ReplayObserver | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        step_monitor: Callable[[], StepMonitor] | None = None,
    ) -> None:
        self.client = client
        self.corpus = corpus
        self.settings = settings
        self.slo = slo
        self.observer = observer
        self.on_step = on_step
        self.step_monitor = step_monitor
        # A session corpus is replayed session by session: the load counts users (replay.conversation).
        self.cursor = SessionCursor(corpus.sessions) if corpus.sessions is not None else RequestCursor(corpus.requests)
        self.think = ThinkTime(settings.think_time_s, settings.think_time_distribution, settings.seed)
        self.think_per_request_s = (
            mean_think_per_request_s(corpus.sessions, self.think) if corpus.sessions is not None else 0.0
        )
        self.steps: list[StepResult] = []
        # Set when the server is known to be gone: the step running stops sending, its partial
        # result is dropped, and StepAborted is raised.
        self.abort = asyncio.Event()

    async def step(self, load: Load, window: Window | None = None) -> StepResult:
        scraper = MetricsScraper(
            self.client.metrics_text, interval_s=self.settings.metrics_interval_s, model=self.client.model
        )
        monitor = self.step_monitor() if self.step_monitor is not None else contextlib.nullcontext()
        async with monitor:
            result = await run_step(
                self.client,
                self.cursor,
                load,
                replace(
                    window or self.settings.window(self.slo),
                    think_per_request_s=self.think_per_request_s,
                    # Judged across steps: the tau and between-step spread of the steps so far.
                    spread=spread_of(self.steps, self.slo) if self.slo else None,
                ),
                requests=self.corpus.requests,
                sessions=self.corpus.sessions,
                think=self.think,
                scraper=scraper,
                observer=self.observer,
                slo=self.slo,
                abort=self.abort,
                ttft_excess=(self.settings.client_ttft_excess_ms, self.settings.client_ttft_excess_fraction),
            )
        if self.abort.is_set():
            raise StepAborted(f"the step at {load.label()} was aborted: the server went away")
        peak = getattr(monitor, "peak_mib", None)
        if peak:
            result.gpu_memory_peak_mib = dict(peak)
        self.steps.append(result)
        if self.on_step is not None:
            self.on_step(result)
        return result

    async def run_planned(self) -> None:
        for load in planned_loads(self.settings):
            await self.step(load)

    async def search(self, *, start: int, upper: int | None) -> SearchOutcome:
        """The search from `start` (a capacity bound, or the saturation probe's count), capped by
        `upper`, within [replay] point_budget_s."""
        settings = self.settings
        began = time.perf_counter()
        budget = settings.point_budget_s
        history = concurrency_history(self.steps, self.slo)
        outcome = SearchOutcome()
        while (
            n := next_probe(
                history, start=start, upper=upper, rel_precision=settings.precision, confirm=settings.confirm_knee
            )
        ) is not None:
            window = self.settings.window(self.slo)
            left = None if budget is None else budget - (time.perf_counter() - began)
            if left is not None and left <= 0:
                outcome.budget_exhausted = True
                break
            # An unresolved concurrency measured again gets twice the time each time.
            misses = sum(1 for p in history if p.concurrency == n and not p.informative)
            if misses:
                earlier = [s.window_limit_s for s in self.steps if s.load.mode == "concurrency" and int(s.load.value) == n]
                longest = max((w for w in earlier if w), default=window.max_window_s)
                if longest is not None:
                    window = replace(window, max_window_s=longest * 2**misses)
            if left is not None:
                window = replace(window, time_budget_s=left)
            if self.observer is not None:
                eta = search_eta_s(
                    self.steps, history, n,
                    min_requests=window.min_requests, rel_precision=settings.precision, confirm=settings.confirm_knee,
                )
                self.observer.probe_planned(n, eta)
            result = await self.step(Concurrency(n), window)
            history.append(probe_of(result, self.slo))
        b = bracket(history)
        outcome.max_passing, outcome.min_failing = b.max_passing, b.min_failing
        outcome.unresolved = [c for c in unresolved(history) if b.min_failing is None or c < b.min_failing]
        return outcome


@dataclass
class SearchOutcome:
    max_passing: int | None = None
    min_failing: int | None = None
    # Concurrencies that only ever ran out of time (below the lowest failure).
    unresolved: list[int] = field(default_factory=list)
    budget_exhausted: bool = False


async def search_start(replay: Replay, settings: ReplaySettings) -> tuple[int, str]:
    """The first probe of `planner replay --find-max`, and why: start_concurrency when given,
    else max_concurrency, else the saturation probe's count."""
    if settings.start_concurrency is not None:
        return settings.start_concurrency, "start_concurrency"
    if settings.max_concurrency is not None:
        return settings.max_concurrency, "max_concurrency"
    cursor = replay.cursor
    if replay.corpus.sessions is not None:
        # A session corpus probes with first turns: a burst of sessions' opening requests.
        cursor = RequestCursor([turn_request(s.turns[0], []) for s in replay.corpus.sessions])
    probe = await saturation_probe(replay.client, cursor, settings.saturation_requests)
    return first_probe(probe, replay.slo)


def served_model_files(identity: Identity, served: str) -> Identity:
    """vLLM serves a model folder under its path: when that folder is here, its files' hash and
    config facts identify the model (unless the caller already did)."""
    folder = Path(served)
    if identity.model.sha256 is not None or not folder.is_dir():
        return identity
    facts = {k: v for k, v in model_config_facts(folder).items() if getattr(identity.model, k) is None}
    model = {**identity.model.model_dump(), "sha256": model_fingerprint(folder), **facts}
    return Identity.model_validate({**identity.model_dump(), "model": model})


def _corpus_info(corpus: Corpus) -> CorpusInfo:
    return CorpusInfo(
        path=str(corpus.path),
        sha256=corpus.sha256,
        requests=len(corpus),
        skipped_invalid=corpus.skipped_invalid,
        sessions=None if corpus.sessions is None else len(corpus.sessions),
    )


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
) -> ReplayResults:
    """`planner replay`: the planned loads, then the search when `settings.find_max`.

    `identity` is what the caller knows of the server (the model's files, the hardware); the
    server's version, the served model, the corpus and the SLOs are filled in here."""
    loads = planned_loads(settings)
    if not loads and not settings.find_max:
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
    known = max([settings.max_concurrency or 0, *settings.concurrency])
    open_loop = bool(settings.rate) or settings.trace
    max_connections = SEARCH_MAX_CONNECTIONS if (open_loop or (settings.find_max and not settings.max_concurrency)) else known
    # Spare connections beside the load's, so /metrics scrapes never wait for a request to finish.
    max_connections += METRICS_CONNECTIONS
    async with StreamingClient(
        url,
        model=model,
        api=settings.api,
        api_key=api_key,
        max_connections=max(max_connections, 1),
        request_timeout_s=settings.request_timeout_s,
        ignore_eos=settings.ignore_eos,
        default_max_tokens=settings.max_tokens,
        extra_body=settings.extra_body,
    ) as client:
        served = await client.check()
        known = served_model_files(identity or Identity(), served)
        results = ReplayResults(
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            url=url,
            model=served,
            api=settings.api,
            corpus=_corpus_info(corpus),
            settings=settings.model_dump(mode="json"),
            slo=slo,
            identity=Identity.model_validate(
                {
                    **known.model_dump(),
                    "vllm_version": known.vllm_version or await client.version(),
                    "model": {**known.model.model_dump(), "name": known.model.name or served},
                    "corpus_sha256": corpus.sha256,
                    "slo": dict(slo),
                }
            ),
            find_max=settings.find_max,
            concurrency_unit="sessions" if corpus.sessions is not None else None,
        )

        def save(_: StepResult | None = None) -> None:
            results.steps = list(replay.steps)
            if output_dir is not None:
                write_json_atomic(Path(output_dir) / RESULTS_FILE, results.model_dump(mode="json"))

        replay = Replay(client, corpus, settings, slo, observer=observer, on_step=save)
        save()
        try:
            await replay.run_planned()
            if settings.find_max:
                start, results.search_start_reason = await search_start(replay, settings)
                results.search_start = start
                save()
                outcome = await replay.search(start=start, upper=settings.max_concurrency)
                lo, hi = outcome.max_passing, outcome.min_failing
                results.max_passing_concurrency = lo
                results.min_failing_concurrency = hi
                results.unresolved_concurrency = outcome.unresolved
                results.budget_exhausted = outcome.budget_exhausted
                cap = "max_concurrency" if hi is None and settings.max_concurrency else None
                results.binding_constraint = binding_constraint(replay.steps, hi, cap)
                results.confirmed, results.knee_interval = knee(replay.steps)
                for name, value in knee_fields(replay.steps, settings.knee_pass_probability).items():
                    setattr(results, name, value)
        except (asyncio.CancelledError, KeyboardInterrupt):
            results.interrupted = True
            raise
        finally:
            save()
        return results
