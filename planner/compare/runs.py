"""Two results files as comparable runs: their identities and their points, matched by configuration.

A sweep's point is keyed by its configuration (the grid's axis values), never by its id or its
fingerprint, which also hold what is only about the run (the corpus, vLLM's version: exactly
what a comparison is about). A replay is one point, the server it ran against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from planner.errors import ReportError
from planner.report.load import load_results
from planner.sweep.results import PointResult, SweepResults
from replay.identity import Identity, ModelIdentity
from replay.results import ReplayResults, StepResult
from replay.search import binding as binding_mod
from replay.search import pass_fit

RunKind = Literal["sweep", "replay"]


@dataclass
class RunPoint:
    key: str
    label: str
    config: dict[str, Any]
    status: str
    gpus: int
    # The search ran (a sweep's point, `planner replay --find-max`).
    searched: bool
    confirmed: bool | None
    knee_interval: list[int | None] | None
    max_passing_concurrency: int | None
    safe_concurrency: int | None
    steps: list[StepResult] = field(default_factory=list)
    failure: str | None = None
    # What bound the search, with the rules undecided there apart (replay.search.binding.describe).
    bound_by: str | None = None
    # From every step (replay.search.pass_fit): where the knee lies, [highest load at and below
    # which every step passed, lowest measured load above every pass], and the fitted answer.
    # None where the point has no closed-loop step: compared by knee_interval then.
    knee_range: list[int | None] | None = None
    knee_fit: int | None = None


@dataclass
class Run:
    path: Path
    kind: RunKind
    identity: Identity
    # False: the file predates recorded identities; `identity` holds what its other fields say.
    identity_recorded: bool
    slo: dict[str, float]
    points: list[RunPoint]


def match_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def config_label(config: dict[str, Any]) -> str:
    parts = []
    for key, value in config.items():
        if key == "env" and isinstance(value, dict):
            parts.extend(f"{k}={v}" for k, v in value.items())
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


def _search(result: PointResult | ReplayResults) -> dict[str, Any]:
    """What the search found, named alike in a sweep's point and in a replay, and what bound it
    with the rules undecided there apart (replay.search.binding.describe)."""
    found = {name: getattr(result, name) for name in ("confirmed", "knee_interval", "max_passing_concurrency", "steps")}
    fitted = pass_fit.fit(result.steps, result.knee_fit_level)
    return found | {
        "bound_by": binding_mod.describe(result.binding_constraint, result.binding_undecided),
        "knee_range": pass_fit.knee_range(fitted),
        "knee_fit": fitted.knee_fit,
    }


def _sweep_point(p: PointResult) -> RunPoint:
    failure = None if p.failure is None else f"{p.failure.kind}: {p.failure.message}"
    return RunPoint(
        key=match_key(p.config),
        label=f"{p.id} ({config_label(p.config)})" if p.config else p.id,
        config=p.config,
        status=p.status,
        gpus=max(1, p.gpus),
        searched=True,
        safe_concurrency=p.safe_concurrency,
        failure=failure,
        **_search(p),
    )


def _from_sweep(path: Path, sweep: SweepResults) -> Run:
    slo = sweep.settings.slo.bounds()
    identity = sweep.identity or Identity(
        vllm_version=sweep.run.vllm_version,
        model=ModelIdentity(name=sweep.settings.server.model),
        corpus_sha256=sweep.run.corpus.sha256 if sweep.run.corpus else None,
        slo=slo,
    )
    if identity.vllm_version is None:
        identity = identity.model_copy(update={"vllm_version": next((p.vllm_version for p in sweep.points if p.vllm_version), None)})
    return Run(path, "sweep", identity, sweep.identity is not None, slo, [_sweep_point(p) for p in sweep.points])


def _from_replay(path: Path, replay: ReplayResults) -> Run:
    identity = replay.identity or Identity(
        model=ModelIdentity(name=replay.model), corpus_sha256=replay.corpus.sha256, slo=dict(replay.slo)
    )
    point = RunPoint(
        key="replay",
        label=f"replay of {replay.model}",
        config={},
        status="ok",
        gpus=1,
        searched=replay.find_max,
        safe_concurrency=None,
        **_search(replay),
    )
    return Run(path, "replay", identity, replay.identity is not None, dict(replay.slo), [point])


def load_run(path: Path) -> Run:
    """A results folder or file (sweep.json or replay.json) as a run; ReportError when it is not one."""
    file, results = load_results(Path(path))
    if isinstance(results, SweepResults):
        return _from_sweep(file, results)
    return _from_replay(file, results)


def match(base: Run, new: Run) -> tuple[list[tuple[RunPoint, RunPoint]], list[RunPoint], list[RunPoint]]:
    """(pairs in the baseline's order, points only in the baseline, points only in the new run)."""
    if base.kind != new.kind:
        raise ReportError(f"{base.path} is a {base.kind} and {new.path} a {new.kind}; compare a {base.kind} with a {base.kind}")
    by_key = {p.key: p for p in new.points}
    base_keys = {p.key for p in base.points}
    pairs = [(p, by_key[p.key]) for p in base.points if p.key in by_key]
    return pairs, [p for p in base.points if p.key not in by_key], [p for p in new.points if p.key not in base_keys]
