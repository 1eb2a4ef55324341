"""What bound a search: the rules that failed conclusively where it stopped, and the rules still
undecided there.

A step fails when any rule fails, and also when one stays inconclusive (replay.slo). A window that
closed early on a conclusive failure (vLLM's KV-cache gauge above its bound, say, after a dozen
requests) leaves the other rules undecided: their intervals straddle their bounds only because the
sample is small. Such a rule did not bind, and saying it did sends a reader to relax the wrong
SLO. So the binding constraint is the set of rules that failed conclusively at the lowest failing
step, and the undecided ones are listed apart, with the sample they were judged on:
"tpot_p90_ms: undecided after 13 requests".

A rule that passed while its interval is open above (a p99 on fewer requests than a finite upper
bound needs) passed on the order-statistic test (replay.intervals.quantile_versus_bound): few
enough of the n requests exceeded the bound. `exceedance_test` records that count and the most
the test allows, so that a report can say why "pass" stands beside "[24.7, ?]".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from replay import intervals
from replay.results import SloExceedance, StepResult

UNDECIDED = ("inconclusive",)


@dataclass(frozen=True)
class Binding:
    """The rules that failed conclusively at the lowest failing step (comma-joined, as results
    keep `binding_constraint`), or the cap the search hit; and the rules undecided there."""

    constraint: str | None = None
    undecided: list[str] = field(default_factory=list)


def measured_requests(step: StepResult) -> int:
    """The requests a step's verdicts were judged on (the steady-state rule's drops excluded)."""
    return step.requests_ok + step.requests_failed


def failed_rules(step: StepResult) -> list[str]:
    """The rules a step broke conclusively. A step from an older file, without per-rule verdicts,
    falls back on its violations."""
    if step.slo_verdicts:
        return [k for k, v in step.slo_verdicts.items() if v == "fail"]
    return list(step.slo_violations)


def undecided_rules(step: StepResult) -> list[str]:
    """The rules whose interval still straddled the bound when the step's window closed."""
    return [k for k, v in step.slo_verdicts.items() if v in UNDECIDED]


def undecided_notes(step: StepResult) -> list[str]:
    n = measured_requests(step)
    return [f"{rule}: undecided after {n} request{'s' if n != 1 else ''}" for rule in undecided_rules(step)]


def lowest_failing_step(steps: Sequence[StepResult], min_failing: int | None) -> StepResult | None:
    """The step that put the lowest failure where it is: the first closed-loop step at
    `min_failing` that did not pass (and, where the results say so, was not disturbed)."""
    if min_failing is None:
        return None
    for step in steps:
        if step.load.mode != "concurrency" or int(step.load.value) != min_failing or step.slo_pass:
            continue
        if step.slo_verdict == "unresolved" or step.disturbed:
            continue
        return step
    return None


def binding(steps: Sequence[StepResult], min_failing: int | None, reached_cap: str | None) -> Binding:
    """What stopped the search: the rules the lowest failing step broke conclusively (None when
    none did: every rule there was undecided), or the cap it hit when nothing failed."""
    if min_failing is None:
        return Binding(constraint=reached_cap)
    step = lowest_failing_step(steps, min_failing)
    if step is None:
        return Binding()
    return Binding(constraint=",".join(failed_rules(step)) or None, undecided=undecided_notes(step))


def exceedance_test(values: Sequence[float] | np.ndarray, q: float, bound: float) -> SloExceedance | None:
    """How many of the n values exceeded `bound`, and the most that the order-statistic test
    (intervals.quantile_versus_bound) lets exceed it for the q-quantile to pass. None for an empty
    sample, or when no count passes (a sample too small for the test)."""
    arr = np.asarray(values, dtype=float)
    n = arr.size
    if n == 0:
        return None
    hits = arr <= bound
    n_eff = intervals.effective_size(n, intervals.autocorrelation_time(hits.astype(float)))
    _, hi_rank = intervals.order_statistic_ranks(n_eff, q)
    if hi_rank is None:
        return None
    needed = min(n, math.ceil(hi_rank * n / n_eff))
    return SloExceedance(exceeded=int(n - hits.sum()), n=int(n), allowed=int(n - needed), effective_n=int(n_eff))


def exceedance_tests(
    samples: Mapping[str, Sequence[float]], slo: Mapping[str, float], rule_verdicts: Mapping[str, str]
) -> dict[str, SloExceedance]:
    """The exceedance test of every client-side percentile rule that passed."""
    out: dict[str, SloExceedance] = {}
    for key, verdict in rule_verdicts.items():
        parts = key.split("_")
        if verdict != "pass" or len(parts) != 3 or parts[2] != "ms" or parts[1] not in intervals.QUANTILES:
            continue
        values = samples.get(parts[0])
        if values is None:
            continue
        test = exceedance_test(values, intervals.QUANTILES[parts[1]], slo[key])
        if test is not None:
            out[key] = test
    return out


def exceedance_text(test: SloExceedance) -> str:
    """`3 of 13 above the bound (at most 4 allowed)`."""
    return f"{test.exceeded} of {test.n} above the bound (at most {test.allowed} allowed)"


def describe(constraint: str | None, undecided: Sequence[str], *, none: str = "-") -> str:
    """One line for a table or a sentence: `kv_cache_usage_max (undecided there: tpot_p90_ms:
    undecided after 13 requests)`."""
    text = constraint or none
    if undecided:
        text += f" (undecided there: {'; '.join(undecided)})"
    return text


def violations_text(step: StepResult) -> str:
    """The rules that kept a step from passing, for a one-line verdict: on a conclusive failure,
    the failed rules with the undecided ones apart (`kv_cache_usage_max (undecided: tpot_p90_ms)`);
    otherwise (inconclusive, unresolved, an older file) every rule that did not pass."""
    failed, undecided = failed_rules(step), undecided_rules(step) if step.slo_verdicts else []
    if step.slo_verdict == "fail" and failed and undecided:
        return ", ".join(failed) + f" (undecided: {', '.join(undecided)})"
    return ", ".join(step.slo_violations)
