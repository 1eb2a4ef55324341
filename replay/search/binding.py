"""What bound a search: the rules that failed conclusively where it stopped, and the rules still
undecided there.

A step fails when any rule fails, and also when one stays inconclusive (replay.slo.rules). A
window that closed early on a conclusive failure (vLLM's KV-cache gauge above its bound, say, after
a dozen requests) leaves the other rules undecided: their intervals straddle their bounds only
because the sample is small. Such a rule did not bind, and saying it did sends a reader to relax
the wrong SLO. So the binding constraint is the set of rules that failed conclusively at the
lowest failing step, and the undecided ones are listed apart, with the sample they were judged on:
"tpot_p90_ms: undecided after 13 requests".

The test that passed a rule whose interval is open above is replay.slo.exceedance's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from replay.results import StepResult
from replay.slo import max_rules

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
    notes = []
    for rule in undecided_rules(step):
        above = max_rules.kv_samples_above(step) if rule == "kv_cache_usage_max" else None
        if above is not None:
            # Judged on /metrics samples, not requests (replay.slo.max_rules).
            notes.append(f"{rule}: undecided on {above} of {step.kv_cache_samples} samples above the bound")
        else:
            notes.append(f"{rule}: undecided after {n} request{'s' if n != 1 else ''}")
    return notes


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
