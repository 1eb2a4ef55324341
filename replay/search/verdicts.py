"""What a search's finished steps say, read the same way by `planner replay`, the sweep and the
report: each closed-loop step as the search sees it (its probe), the knee and whether it was
confirmed, the knee read from every step (replay.search.pass_fit), and the constraint that bound
the answer (replay.search.binding: the rules that failed conclusively, the undecided ones
apart)."""

from __future__ import annotations

from replay.results import StepResult
from replay.search import pass_fit
from replay.search.binding import binding
from replay.search.policy import Probe, bracket, is_confirmed, knee_interval
from replay.slo import rules as slo_mod


def binding_constraint(steps: list[StepResult], min_failing: int | None, reached_cap: str | None) -> str | None:
    """What stopped the search: the SLOs the lowest failing step broke conclusively, or the cap it
    hit (replay.search.binding; the rules undecided there are `binding(...).undecided`)."""
    return binding(steps, min_failing, reached_cap).constraint


def probe_of(step: StepResult, slo: dict[str, float] | None = None) -> Probe:
    """A closed-loop step as the search sees it: its verdict (an inconclusive step did not pass;
    steps without a verdict, from older files, count by slo_pass) and, with the SLOs, each rule's
    measured / bound."""
    verdict = step.slo_verdict or ("pass" if step.slo_pass else "fail")
    if step.disturbed:
        # Something else ran during the window: no information, like an unresolved step.
        verdict = "disturbed"
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
    verdicts = [(p.concurrency, p.verdict) for p in history]
    return (lo is not None and is_confirmed(history, lo)), knee_interval(verdicts)


def recommended_load(
    max_passing: int | None, knee_fit: int | None, fitted: bool, start_knees: dict[int, int | None] | None = None
) -> tuple[int | None, str]:
    """The load a recommendation takes its headroom from, and which it is: the knee read from
    every step (`knee_fit`: the highest measured load whose fitted pass probability is at the
    configured level) whenever the point's steps were fitted, so that one lucky or unlucky step
    does not move the answer; the search's own `max_passing` for a file written before the fit
    (`fitted` false). A fit that found no load at its level recommends nothing. A point measured
    on several server starts (`start_knees`: each start's own knee) answers with the load that
    held on more than half of them ("start_majority", replay.search.pass_fit.majority_knee)."""
    if start_knees:
        return pass_fit.majority_knee(list(start_knees.values())), "start_majority"
    if fitted:
        return knee_fit, "knee_fit"
    return max_passing, "max_passing"


def knee_fields(steps: list[StepResult], level: float = pass_fit.DEFAULT_LEVEL) -> dict[str, object]:
    """The result fields of the knee read from every step (replay.search.pass_fit)."""
    fitted = pass_fit.fit(steps, level)
    return {
        "knee_fit": fitted.knee_fit,
        "knee_fit_level": level,
        "knee_band": fitted.knee_band,
        "contested_concurrency": fitted.contested,
        "pass_probability": fitted.points,
    }
