"""A knee read from all the steps of a point: the probability of passing against load.

The search's answer is the highest load whose own step passed below the lowest failure, so one
unlucky step moves it. Here every closed-loop step of the point counts. Each step is a trial at
its load: a pass is 1; a fail or an inconclusive step (it did not pass) is 0; an inconclusive one
weighs half, as it says less either way; an unresolved or disturbed one (no information) is left
out. The pass fraction at each load is fitted by weighted isotonic regression, non-increasing in load
(pool-adjacent-violators: the one assumption is that passing does not get likelier as load
rises). Loads that the fit pools share their estimate and their evidence, and each estimate gets
a Wilson 95% interval on the pooled weight.

- `knee_fit`: the highest measured load whose fitted pass probability is at or above the level
  ([replay] knee_pass_probability, default 0.9); None when none is.
- `knee_band`: [the highest load at and below which every step passed, the highest load with a
  pass]. Between them the steps disagree or fail; when they agree the band is one load wide.
- `contested`: loads that both passed and did not pass. They are shown, never hidden: a load
  that failed once and passed once is not "the lowest conclusive fail" without its pass.
- `start_knees`, `majority_knee`, `starts_disagree`, `describe_starts`: for a point searched on
  several server starts ([sweep] server_starts), each start's own knee (the same fit over that
  start's steps), and the answer as the load that held on more than half of the starts. An engine
  whose speed differs between starts shows it there; where two starts disagree by more than one
  precision step, one more start ([sweep] tie_break_starts) settles the answer by majority.
- `rare_event_margin`: the strict `max_preemptions = 0` rule where it capped the answer, from the
  preemption rate pooled over the steps at and above the load that broke it. A step passes that
  rule when no preemption came in its first `EXPOSURE_REQUESTS` measured requests, a trial that
  passes with probability exp(-EXPOSURE_REQUESTS x rate). Where that probability's interval
  reaches below the level, the report says so: the preemptions cap the knee (the interval wholly
  below the level), or the knee may rest on one chance preemption (across it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from replay.results import PassPoint, StepResult
from replay.search.policy import Probe, bracket
from replay.slo import rules as slo_mod
from replay.slo.max_rules import EXPOSURE_REQUESTS, poisson_interval
from replay.stats.across_steps import informative
from replay.stats.intervals import Z_975
from replay.stats.isotonic import isotonic

DEFAULT_LEVEL = 0.9
INCONCLUSIVE_WEIGHT = 0.5
# A rule whose figure stays within this share of its bound over two or more measured loads in a
# row, up to the highest, has little margin: its verdicts there are close to coin tosses.
LITTLE_MARGIN = 0.10


@dataclass(frozen=True)
class KneeFit:
    points: list[PassPoint]
    knee_fit: int | None
    knee_band: list[int | None]
    contested: list[int]
    level: float


def wilson(p: float, n: float) -> tuple[float, float]:
    if n <= 0:
        return 0.0, 1.0
    z2 = Z_975**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_975 * math.sqrt(max(0.0, p * (1 - p) / n + z2 / (4 * n * n))) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def trials(steps: Sequence[StepResult]) -> list[tuple[int, str]]:
    """(concurrency, verdict) of every informative closed-loop step, in order; a step without a
    verdict (an older file) counts by slo_pass."""
    return [(int(s.load.value), s.slo_verdict or ("pass" if s.slo_pass else "fail")) for s in informative(steps)]


def level_of(level: float | None) -> float:
    """The level a result holds, or the default where it holds none (files written before the
    fit, or a replay's settings left at the default)."""
    return DEFAULT_LEVEL if level is None else level


def fit(steps: Sequence[StepResult], level: float | None = None) -> KneeFit:
    """The fit over `steps` at `level` (a result's `knee_fit_level`; None: the default)."""
    return fit_trials(trials(steps), level_of(level))


def fit_trials(verdicts: Sequence[tuple[int, str]], level: float = DEFAULT_LEVEL) -> KneeFit:
    if not 0 < level < 1:
        raise ValueError(f"pass probability level {level!r} must be between 0 and 1")
    loads = sorted({c for c, _ in verdicts})
    if not loads:
        return KneeFit([], None, [None, None], [], level)
    weight = {c: 0.0 for c in loads}
    passed = {c: 0.0 for c in loads}
    counts = {c: [0, 0] for c in loads}  # passes, steps
    for c, v in verdicts:
        w = INCONCLUSIVE_WEIGHT if v == "inconclusive" else 1.0
        weight[c] += w
        passed[c] += w if v == "pass" else 0.0
        counts[c][0] += v == "pass"
        counts[c][1] += 1
    # Non-increasing in load: fit the non-decreasing sequence of failure fractions.
    failing = isotonic([1.0 - passed[c] / weight[c] for c in loads], [weight[c] for c in loads])
    probability = [1.0 - f for f in failing]
    points = []
    for i, c in enumerate(loads):
        pooled = sum(weight[x] for j, x in enumerate(loads) if abs(probability[j] - probability[i]) < 1e-12)
        lo, hi = wilson(probability[i], pooled)
        points.append(
            PassPoint(
                concurrency=c, passes=counts[c][0], steps=counts[c][1],
                probability=round(probability[i], 4), ci95=[round(lo, 4), round(hi, 4)],
            )
        )  # fmt: skip
    at_level = [c for c, p in zip(loads, probability) if p >= level - 1e-12]
    contested = [c for c in loads if 0 < counts[c][0] < counts[c][1]]
    all_pass = None
    for c in loads:
        if counts[c][0] != counts[c][1]:
            break
        all_pass = c
    any_pass = max((c for c in loads if counts[c][0]), default=None)
    return KneeFit(points, max(at_level) if at_level else None, [all_pass, any_pass], contested, level)


def knee_range(fit: KneeFit) -> list[int | None] | None:
    """Where the knee lies, from every step: [the highest load at and below which every step
    passed, the lowest measured load above every pass]. Either end is None when no load gives it
    (nothing passed cleanly; nothing above the last pass was measured); None without steps.
    Two runs' ranges are what `planner compare` sets side by side."""
    if not fit.points:
        return None
    lo, hi = fit.knee_band
    above = [p.concurrency for p in fit.points if hi is None or p.concurrency > hi]
    return [lo, min(above) if above else None]


def describe(fit: KneeFit) -> str | None:
    """One line for a report: "knee 43-52: 43 passed 2 of 2, 48 1 of 2; 0.9 pass probability up
    to 43"; None without steps."""
    if not fit.points:
        return None
    lo, hi = fit.knee_band
    shown = [p for p in fit.points if (lo is None or p.concurrency >= lo) and (hi is None or p.concurrency <= hi)]
    parts = ", ".join(f"{p.concurrency} passed {p.passes} of {p.steps}" for p in shown) or "no load passed"
    band = f"{lo if lo is not None else '-'}-{hi if hi is not None else '-'}"
    answer = (
        f"{fit.knee_fit} has pass probability >= {fit.level:g}" if fit.knee_fit is not None
        else f"no load reached pass probability {fit.level:g}"
    )
    contested = f"; passed and failed at {', '.join(map(str, fit.contested))}" if fit.contested else ""
    return f"knee {band}: {parts}; {answer}{contested}"


def start_knees(steps: Sequence[StepResult], level: float | None = None) -> dict[int, int | None] | None:
    """Each server start's own knee ([sweep] server_starts): the fit over that start's steps
    alone, by start; None for a point measured on one start."""
    starts = sorted({s.server_start for s in steps if s.server_start is not None})
    if len(starts) < 2:
        return None
    return {start: fit([s for s in steps if s.server_start == start], level).knee_fit for start in starts}


def majority_count(starts: int) -> int:
    """How many of `starts` server starts are more than half of them."""
    return starts // 2 + 1


def majority_knee(knees: Sequence[int | None]) -> int | None:
    """The highest load that held on more than half of the starts: with the starts' own knees in
    descending order, the (n // 2 + 1)th. Two starts must both hold it (the lower knee); three
    answer with the middle one, so one start whose engine ran slower, or faster, does not move
    it. A start without a knee (nothing reached the level) counts below every load."""
    if not knees:
        return None
    ordered = sorted(knees, key=lambda k: -1 if k is None else k, reverse=True)
    return ordered[majority_count(len(knees)) - 1]


def starts_disagree(knees: Sequence[int | None], rel_precision: float) -> bool:
    """Whether the starts' own knees lie more than one precision step apart (the search's own
    resolution): no start can then speak for the others, and another start settles it."""
    if len(knees) < 2:
        return False
    if any(k is None for k in knees):
        return any(k is not None for k in knees)
    lo, hi = min(knees), max(knees)  # type: ignore[type-var]
    return hi - lo > max(1, math.ceil(rel_precision * lo))


def describe_starts(steps: Sequence[StepResult], level: float | None = None) -> str | None:
    """One line for a point searched on several server starts ([sweep] server_starts): what each
    start's own steps bracket and its own knee, and the load that held on most of them, "server
    starts: 1 passed up to 56, failed at 57 (4 steps, knee 56); 2 passed up to 45, failed at 49
    (6 steps, knee 45); the answer is what held on 2 of 2: 45"; None for one start."""
    knees = start_knees(steps, level)
    if knees is None:
        return None
    parts = []
    for start, knee in knees.items():
        own = trials([s for s in steps if s.server_start == start])
        own_bracket = bracket([Probe(c, v) for c, v in own])
        up_to = f"passed up to {own_bracket.max_passing}" if own_bracket.max_passing is not None else "passed nothing"
        above = f", failed at {own_bracket.min_failing}" if own_bracket.min_failing is not None else ", nothing above tried"
        steps_n = f"{len(own)} step{'' if len(own) == 1 else 's'}"
        parts.append(f"{start} {up_to}{above} ({steps_n}, knee {'-' if knee is None else knee})")
    n = len(knees)
    answer = majority_knee(list(knees.values()))
    held = f"{answer}" if answer is not None else "no load"
    return f"server starts: {'; '.join(parts)}; the answer is what held on {majority_count(n)} of {n}: {held}"


def little_margin(steps: Sequence[StepResult], slo: Mapping[str, float]) -> list[str]:
    """Rules whose figure stays within `LITTLE_MARGIN` of its bound from some load up to the
    highest measured: "tpot_p90_ms 27-30 against 30 from 45 up (4 loads): little margin". The
    figure per load is the median over its steps (replay.slo.rules.ratios: measured / bound)."""
    by_rule: dict[str, dict[int, list[float]]] = {}
    for s in informative(steps):
        for rule, ratio in slo_mod.ratios(s, slo).items():
            by_rule.setdefault(rule, {}).setdefault(int(s.load.value), []).append(ratio)
    out = []
    for rule, loads in by_rule.items():
        xs = sorted(loads)
        medians = [statistics.median(loads[x]) for x in xs]
        run = 0
        for m in reversed(medians):
            if abs(m - 1.0) > LITTLE_MARGIN:
                break
            run += 1
        if run < 2:
            continue
        tail = [r for x in xs[-run:] for r in loads[x]]
        bound = slo[rule]
        if rule == slo_mod.ATTAINMENT_KEY:
            out.append(
                f"{rule} within {LITTLE_MARGIN:.0%} of its bound from {xs[-run]} up ({run} loads): little margin"
            )
            continue
        out.append(
            f"{rule} {min(tail) * bound:.3g}-{max(tail) * bound:.3g} against {bound:g} from {xs[-run]} up"
            f" ({run} loads): little margin"
        )
    return out


def rare_event_margin(steps: Sequence[StepResult], slo: Mapping[str, float], answer: int | None, level: float | None = None) -> list[str]:
    """The strict `max_preemptions = 0` rule where it capped the answer and the point's preemptions
    leave it unsure: "max_preemptions = 0 capped the knee at 28: 29 broke it; from 29 up, 1
    preemption in 142 requests over 3 steps: a 100-request step passes it with probability 0.49
    (95%: 0.02-0.98), against the 0.9 the answer is read at: the steps cannot tell the rule from
    one chance preemption, and the knee may rest on one"; empty otherwise.

    It applies when a step at the lowest load above the answer that did not pass broke that rule.
    Preemptions do not get rarer as load rises, so the steps at and above that load bound its rate
    from above; their preemptions per measured request (with an exact Poisson interval) give the
    probability that a step passes the rule there. When that interval reaches below the level,
    the line is written: wholly below, the preemptions cap the knee (on vLLM, a pool that fills);
    across the level, the steps cannot tell a knee capped by the rule from one capped by a single
    preemption."""
    if answer is None or slo.get("max_preemptions") != 0:
        return []
    measured = informative(steps)
    above = sorted({int(s.load.value) for s in measured if int(s.load.value) > answer and not s.slo_pass})
    if not above:
        return []
    capped = above[0]
    broke = [
        s for s in measured
        if int(s.load.value) == capped and not s.slo_pass
        and (s.slo_verdicts.get("max_preemptions") == "fail" or "max_preemptions" in s.slo_violations)
    ]  # fmt: skip
    if not broke:
        return []
    counted = [
        s for s in measured
        if int(s.load.value) >= capped and s.server.preemptions is not None and s.requests_ok + s.requests_failed > 0
    ]  # fmt: skip
    seen = sum(s.server.preemptions for s in counted)
    n = sum(s.requests_ok + s.requests_failed for s in counted)
    if not seen or not n:
        return []
    level = level_of(level)
    lo, hi = poisson_interval(int(round(seen)))
    p = math.exp(-EXPOSURE_REQUESTS * seen / n)
    p_lo, p_hi = math.exp(-EXPOSURE_REQUESTS * hi / n), math.exp(-EXPOSURE_REQUESTS * lo / n)
    if p_lo >= level:
        return []
    return [
        f"max_preemptions = 0 capped the knee at {answer}: {capped} broke it; from {capped} up, {seen:g}"
        f" preemption{'' if seen == 1 else 's'} in {n} requests over {len(counted)} step{'' if len(counted) == 1 else 's'}:"
        f" a {EXPOSURE_REQUESTS}-request step passes it with probability {p:.2f} (95%: {p_lo:.2f}-{p_hi:.2f}),"
        f" against the {level:g} the answer is read at: "
        + (
            "the preemptions there cap the knee" if p_hi < level
            else "the steps cannot tell the rule from one chance preemption, and the knee may rest on one"
        )
    ]
