"""`compare(base, new)`: what changed between two runs, and whether capacity moved beyond the noise.

    identity     replay.identity.differences: vLLM, model, flags, env, hardware, corpus, SLOs
    points       matched by configuration (planner.compare.runs); the rest listed per side
    capacity     per point, from the knee read from every step (capacity_verdict: the ranges
                 replay.search.pass_fit.knee_range gives; the knee intervals for points without
                 closed-loop steps)
    statistics   per point, at every load measured in both runs: each SLO-bound client latency
                 statistic and output tokens/s per GPU, tested on their stored 95% intervals
                 (planner.compare.stats), Holm-corrected over the whole comparison

Verdicts: `regressed` / `improved` when the evidence says so, `unchanged` when it shows no
difference, `inconclusive` when it cannot tell (an unconfirmed or open knee, an open interval).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.compare import stats
from planner.compare.identity import differences
from planner.compare.runs import Run, RunPoint, match
from replay.identity import Identity, ModelIdentity
from replay.results import StepResult

Verdict = Literal["regressed", "improved", "unchanged", "inconclusive"]

THROUGHPUT = "output_tokens_per_s_per_gpu"
_LATENCY_KEY = re.compile(r"^(ttft|itl|tpot|e2e)_(mean|p50|p90|p95|p99)_ms$")
METHOD = (
    "difference of the stored 95% intervals by MOVER (each side's interval half-width taken as its"
    " 1.96 standard errors; the intervals use the effective sample size of correlated requests),"
    f" two-sided, Holm-corrected over every figure compared, family-wise level {stats.ALPHA:g}"
)


class _Strict(BaseModel):
    # Built here, never read back: a misspelt field is a bug to catch, not a newer file to tolerate.
    model_config = ConfigDict(extra="forbid")


class StatisticComparison(_Strict):
    load: str
    value: float
    statistic: str
    base: float | None
    base_ci95: list[float | None] | None
    new: float | None
    new_ci95: list[float | None] | None
    change_fraction: float | None = None
    difference_ci95: list[float | None] | None = None
    p_value: float | None = None
    verdict: Verdict = "inconclusive"


class CapacityComparison(_Strict):
    base_max_passing_concurrency: int | None
    new_max_passing_concurrency: int | None
    base_safe_concurrency: int | None
    new_safe_concurrency: int | None
    base_knee_interval: list[int | None] | None
    new_knee_interval: list[int | None] | None
    base_confirmed: bool | None
    new_confirmed: bool | None
    # From every step (replay.search.pass_fit): where the knee lies, [highest load at and below
    # which every step passed, lowest measured load above every pass], and the fitted answer.
    base_knee_range: list[int | None] | None = None
    new_knee_range: list[int | None] | None = None
    base_knee_fit: int | None = None
    new_knee_fit: int | None = None
    verdict: Verdict
    # What bound each search: the rules that failed conclusively, the undecided ones apart.
    base_bound_by: str | None = None
    new_bound_by: str | None = None
    reason: str


class PointComparison(_Strict):
    key: str
    label: str
    config: dict
    base_status: str
    new_status: str
    # None when neither run searched for the knee (`planner replay` without --find-max).
    capacity: CapacityComparison | None = None
    statistics: list[StatisticComparison] = Field(default_factory=list)
    verdict: Verdict = "inconclusive"
    # What decided the verdict, one phrase each.
    reasons: list[str] = Field(default_factory=list)


class Comparison(_Strict):
    base: str
    new: str
    kind: str
    identity_changes: list[str]
    base_identity: Identity
    new_identity: Identity
    # False where a file predates recorded identities (only its corpus, SLOs and version are known).
    base_identity_recorded: bool
    new_identity_recorded: bool
    only_in_base: list[str]
    only_in_new: list[str]
    points: list[PointComparison]
    verdict: Verdict
    method: str = METHOD
    tests: int = 0
    # Significant changes smaller than this fraction of the baseline's figure count as unchanged.
    min_change: float = 0.0

    def regressed(self) -> bool:
        return any(p.verdict == "regressed" for p in self.points)

    def changed(self) -> bool:
        return any(p.verdict in ("regressed", "improved") for p in self.points)


def capacity_verdict(base: RunPoint, new: RunPoint) -> tuple[Verdict, str]:
    """The knee rule: the new knee band (replay.search.pass_fit.knee_range, from every step; the
    knee interval for points without closed-loop steps) entirely below the baseline's is a
    regression, entirely above an improvement, overlapping unchanged; unconfirmed or open is
    inconclusive.
    A point that ran before and does not now (failed, infeasible) regressed."""
    # [sweep] strategy = "adaptive" settles some points unsearched: such a point is compared only
    # with one settled the same way ("dominated in both runs"), never with a measured one.
    unsearched = ("dominated", "predicted")
    if (base.status in unsearched) != (new.status in unsearched):
        side, status = ("baseline", base.status) if base.status in unsearched else ("new run", new.status)
        return "inconclusive", (
            f"not searched in the {side} ({status} by the adaptive strategy): compared only with a point {status} there too"
        )
    if base.status == "ok" and new.status != "ok":
        return "regressed", f"ran in the baseline; now {new.status}" + (f" ({new.failure})" if new.failure else "")
    if base.status != "ok" and new.status == "ok":
        return "improved", f"{base.status} in the baseline; now runs"
    if base.status != "ok":
        if base.status == new.status:
            return "unchanged", f"{base.status} in both runs"
        return "inconclusive", f"{base.status} in the baseline, {new.status} now"
    # Ranges from every step where both points have closed-loop steps: a load that passed and
    # failed widens its run's range instead of moving a single number (replay.search.pass_fit).
    banded = base.knee_range is not None and new.knee_range is not None
    what = "knee band" if banded else "knee"
    ranges = {}
    for side, point in (("baseline", base), ("new run", new)):
        if point.confirmed is not True:
            return "inconclusive", f"the {side}'s knee is unconfirmed"
        ranges[side] = point.knee_range if banded else point.knee_interval
        if not ranges[side] or None in ranges[side]:
            return "inconclusive", f"the {side}'s {what} is open ({_interval(ranges[side])})"
    b_lo, b_hi = ranges["baseline"]
    n_lo, n_hi = ranges["new run"]
    b_text, n_text = _interval(ranges["baseline"]), _interval(ranges["new run"])
    if n_hi <= b_lo:
        return "regressed", f"{what} {n_text} entirely below {b_text}"
    if n_lo >= b_hi:
        return "improved", f"{what} {n_text} entirely above {b_text}"
    return "unchanged", f"{what} {n_text} overlaps {b_text}"


def _interval(knee: list[int | None] | None) -> str:
    if not knee:
        return "[?, ?]"
    return "[" + ", ".join("?" if v is None else str(v) for v in knee) + "]"


def compared_statistics(slo_keys) -> list[str]:
    """The SLO-bound client latency statistics (those with an interval), then throughput per GPU."""
    return sorted({k for k in slo_keys if _LATENCY_KEY.match(k)}) + [THROUGHPUT]


def figure(step: StepResult, statistic: str, gpus: int) -> tuple[float | None, list[float | None] | None]:
    """A step's estimate of `statistic` and its 95% interval."""
    if statistic == THROUGHPUT:
        ci = step.output_tokens_per_s_ci95
        per = [None if v is None else v / gpus for v in ci] if ci else None
        return step.output_tokens_per_s / gpus, per
    metric, stat = _LATENCY_KEY.match(statistic).groups()
    summary = getattr(step, f"{metric}_ms")
    return getattr(summary, stat), (summary.ci95 or {}).get(stat)


def _load_key(step: StepResult) -> tuple[str, float]:
    return step.load.mode, step.load.value


def representative_steps(steps: list[StepResult]) -> dict[tuple[str, float], StepResult]:
    """One step per load: the one that measured the most requests (the later on a tie); steps
    that measured nothing or ran out of time (unresolved) say nothing to compare."""
    out: dict[tuple[str, float], StepResult] = {}
    for step in steps:
        if step.requests_ok == 0 or step.slo_verdict == "unresolved":
            continue
        key = _load_key(step)
        if key not in out or step.requests_ok >= out[key].requests_ok:
            out[key] = step
    return out


def _worse(statistic: str, difference: float) -> bool:
    return difference < 0 if statistic == THROUGHPUT else difference > 0


def _statistics(base: RunPoint, new: RunPoint, names: list[str]) -> list[tuple[StatisticComparison, stats.Test | None]]:
    b_steps, n_steps = representative_steps(base.steps), representative_steps(new.steps)
    out = []
    for key in sorted(set(b_steps) & set(n_steps)):
        for name in names:
            b, b_ci = figure(b_steps[key], name, base.gpus)
            n, n_ci = figure(n_steps[key], name, new.gpus)
            test = stats.difference_test(b, b_ci, n, n_ci)
            row = StatisticComparison(
                load=key[0],
                value=key[1],
                statistic=name,
                base=b,
                base_ci95=b_ci,
                new=n,
                new_ci95=n_ci,
                change_fraction=(n - b) / b if b and n is not None else None,
                difference_ci95=None if test is None else [test.lower, test.upper],
                p_value=None if test is None else test.p_value,
            )
            out.append((row, test))
    return out


def _load_text(row: StatisticComparison) -> str:
    return f"{row.value:g}" if row.load == "concurrency" else f"{row.load} {row.value:g}"


def _point_verdict(point: PointComparison) -> PointComparison:
    reasons: list[str] = []
    verdicts = []
    if point.capacity is not None:
        verdicts.append(point.capacity.verdict)
        if point.capacity.verdict != "unchanged":
            reasons.append(f"capacity {point.capacity.verdict}: {point.capacity.reason}")
    for row in point.statistics:
        if row.verdict in ("regressed", "improved"):
            change = f" ({row.change_fraction:+.1%})" if row.change_fraction is not None else ""
            reasons.append(f"{row.statistic} at {_load_text(row)} {row.verdict}{change}")
    tested = [r.verdict for r in point.statistics if r.verdict != "inconclusive"]
    verdicts += tested
    if "regressed" in verdicts:
        verdict: Verdict = "regressed"
    elif "improved" in verdicts:
        verdict = "improved"
    elif point.capacity is not None and point.capacity.verdict == "inconclusive":
        verdict = "inconclusive"
    elif "unchanged" in verdicts:
        verdict = "unchanged"
    else:
        verdict = "inconclusive"
        reasons.append("no load measured in both runs with figures that can be tested")
    return point.model_copy(update={"verdict": verdict, "reasons": reasons})


def _what_old_files_say(identity: Identity) -> Identity:
    """The part of an identity that files from before `identity` also hold."""
    return Identity(
        vllm_version=identity.vllm_version,
        model=ModelIdentity(name=identity.model.name),
        corpus_sha256=identity.corpus_sha256,
        slo=identity.slo,
    )


def compare(base: Run, new: Run, *, min_change: float = 0.0) -> Comparison:
    """Compare two runs. A significant change of a figure smaller than `min_change` (a fraction
    of the baseline's value) is called unchanged: real, but too small to matter."""
    pairs, only_base, only_new = match(base, new)
    names = compared_statistics(set(base.slo) | set(new.slo))
    points: list[PointComparison] = []
    tested: list[tuple[StatisticComparison, stats.Test]] = []
    for b, n in pairs:
        capacity = None
        if b.searched and n.searched:
            verdict, reason = capacity_verdict(b, n)
            capacity = CapacityComparison(
                base_max_passing_concurrency=b.max_passing_concurrency,
                new_max_passing_concurrency=n.max_passing_concurrency,
                base_safe_concurrency=b.safe_concurrency,
                new_safe_concurrency=n.safe_concurrency,
                base_knee_interval=b.knee_interval,
                new_knee_interval=n.knee_interval,
                base_confirmed=b.confirmed,
                new_confirmed=n.confirmed,
                base_knee_range=b.knee_range,
                new_knee_range=n.knee_range,
                base_knee_fit=b.knee_fit,
                new_knee_fit=n.knee_fit,
                base_bound_by=b.bound_by,
                new_bound_by=n.bound_by,
                verdict=verdict,
                reason=reason,
            )
        rows = _statistics(b, n, names)
        tested += [(row, test) for row, test in rows if test is not None]
        points.append(
            PointComparison(
                key=b.key,
                label=b.label,
                config=b.config,
                base_status=b.status,
                new_status=n.status,
                capacity=capacity,
                statistics=[row for row, _ in rows],
            )
        )
    # Holm over every testable figure of the comparison: one false alarm in all at most 5% of the time.
    significant = stats.holm([test.p_value for _, test in tested])
    for (row, test), hit in zip(tested, significant, strict=True):
        small = row.change_fraction is not None and abs(row.change_fraction) < min_change
        row.verdict = ("regressed" if _worse(row.statistic, test.difference) else "improved") if hit and not small else "unchanged"
    points = [_point_verdict(p) for p in points]
    found = {p.verdict for p in points}
    overall: Verdict = next((v for v in ("regressed", "improved", "inconclusive", "unchanged") if v in found), "inconclusive")
    return Comparison(
        base=str(base.path),
        new=str(new.path),
        kind=base.kind,
        identity_changes=(
            differences(base.identity, new.identity)
            if base.identity_recorded and new.identity_recorded
            # Against an older file, only what both say: its unknowns are not changes.
            else differences(_what_old_files_say(base.identity), _what_old_files_say(new.identity))
        ),
        base_identity=base.identity,
        new_identity=new.identity,
        base_identity_recorded=base.identity_recorded,
        new_identity_recorded=new.identity_recorded,
        only_in_base=[p.label for p in only_base],
        only_in_new=[p.label for p in only_new],
        points=points,
        verdict=overall,
        tests=len(tested),
        min_change=min_change,
    )
