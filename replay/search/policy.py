"""The search for the highest concurrency that passes every SLO.

A pure function of the steps so far: `next_probe(history) -> int | None`.

Where to measure. A step costs about `requests x request duration / concurrency` of wall time,
so low concurrencies are the dearest to measure and, where the SLOs hold with a wide margin, the
least informative. The search therefore starts high (the caller's capacity bound: the KV pool
over the corpus's blocks, `max_num_seqs`, or a saturation probe's count of requests the server
runs at once) and narrows down:

1. Each SLO that bounds a figure from above (a latency statistic, the KV-cache usage peak) gives
   a ratio per step: measured / bound, above 1 where it broke. Per rule, the ratios are fitted
   against concurrency by isotonic regression (non-decreasing: the model's one assumption is that
   latency does not fall as load rises), and the crossing of 1 is interpolated linearly between
   the fitted points around it (decode-bound TPOT is close to linear in the number running).
   Below the lowest step the line through the two lowest points is extended (or, from one point,
   a ratio proportional to concurrency). The next probe is the lowest crossing of any rule.
2. Once a step passes just below the predicted crossing, the next probe closes the bracket from
   above: one precision step (5%, at least one request) over the highest pass.
3. Bisection is the fallback: when no rule gives a ratio (errors, preemptions), when the model
   points outside the bracket, and when two model probes in a row landed on the same side
   (regula falsi can creep along one side). Before anything has passed, a model that places the
   knee just under a failed step steps down instead, by 10% of it, doubling with each further
   conclusive failure since the last pass up to a half (an inconclusive step read close to its
   bound and does not double it): halving at once would measure far below a knee the model puts
   close by. For the same reason the line extended below the lowest step never crosses 1 deeper
   than half the crossing of the line through the origin and that step: steps above the knee can
   read nearly flat (short steps closed early on a failure; a full KV pool, where the running
   batch stops growing), and a flat line crosses far under the knee (the repeatability
   benchmark's 67, 57 and 47, read 1.16, 1.25 and 1.16 of the bound, put it at 6).

Measurements are noisy, so a pass above a failure is ignored: the answer is always the highest
pass below the lowest failure. An inconclusive step (its interval straddles the bound after the
window's largest sample) counts as a failure, so the answer never rests on a step that did not
pass. An `unresolved` step (its window ran out of time before it had the requests a finite bound
needs, with the estimate inside the bound) carries no information: it is neither a pass nor a
failure; the same concurrency is proposed again (the caller gives it a longer window) at most
`UNRESOLVED_RETRIES` times, then a higher one, then the search stops and the caller says which
steps stayed unresolved.

A `disturbed` step (its window saw other processes on the server's CPUs, a foreign process on its
GPUs, or throttled clocks: replay.step.environment) carries no information either: the same
concurrency is proposed again up to `disturbed_retries` times, then the search stops there and
the caller names the disturbed steps. An answer never rests on a disturbed step.

With `confirm`, the highest pass is measured once more before the search ends (the step runner
takes fresh prompts); if the repeat does not pass, that concurrency now counts as failing, and
the search goes on below it, first one precision step below it (a load that passed once is
near the knee; falling back to the bracket's low end, often the start-up's guess, paid for
steps far below it), and confirms again. The same holds whenever a step at or just above the
lowest failure (within two precision steps) passed: the steps disagree there, and the knee is
close below.

The confirmation is also the guard on the model's assumption: a server whose latency fell with
load would show it as a pass that does not repeat.

Across server starts ([sweep] server_starts, planner.sweep.point), the search on a later start
goes on from the steps of the earlier ones, pooled: the highest pass must pass again on the new
start (`confirm_from`) before the search ends, and where it does not, the search goes on below it
on that start, as after any repeat that did not hold. An engine whose speed differs between
starts so answers with the slower start's knee, and every start's steps stay in the fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from replay.stats.isotonic import isotonic

# How many times an unresolved concurrency is measured again (each time with a longer window).
UNRESOLVED_RETRIES = 1
# How many times a disturbed concurrency is measured again (the caller's default may differ).
DISTURBED_RETRIES = 2
# Verdicts that carry no information: the window ran out of time, or something else ran.
NO_INFORMATION = ("unresolved", "disturbed")


@dataclass(frozen=True)
class Probe:
    """One measured step as the search sees it."""

    concurrency: int
    # "pass", "fail", "inconclusive" (a failure), "unresolved" or "disturbed" (no information).
    verdict: str
    # SLO rule -> measured / bound, for rules that bound a figure from above.
    ratios: Mapping[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def informative(self) -> bool:
        return self.verdict not in NO_INFORMATION


History = Sequence["Probe | tuple[int, bool]"]


def as_probes(history: History) -> list[Probe]:
    """Probes from `history`, which may also hold (concurrency, passed) pairs."""
    return [
        h if isinstance(h, Probe) else Probe(int(h[0]), "pass" if h[1] else "fail")
        for h in history
    ]


@dataclass(frozen=True)
class Bracket:
    max_passing: int | None
    min_failing: int | None


def bracket(history: History) -> Bracket:
    probes = [p for p in as_probes(history) if p.informative]
    fails = [p.concurrency for p in probes if not p.passed]
    min_failing = min(fails) if fails else None
    passes = [p.concurrency for p in probes if p.passed and (min_failing is None or p.concurrency < min_failing)]
    return Bracket(max(passes) if passes else None, min_failing)


def converged(lo: int, hi: int, rel_precision: float) -> bool:
    return hi - lo <= 1 or (lo > 0 and (hi - lo) <= rel_precision * lo)


def next_probe(
    history: History,
    *,
    start: int = 1,
    upper: int | None = None,
    rel_precision: float = 0.05,
    confirm: bool = False,
    disturbed_retries: int = DISTURBED_RETRIES,
    confirm_from: int = 0,
) -> int | None:
    """The next concurrency to measure, or None when the search is done.

    `history` holds every step so far (Probes, or (concurrency, passed) pairs). `start` is the
    first probe; `upper` caps the search (a capacity bound): when it passes, nothing above it is
    tried. `confirm`: end only once the highest pass has passed twice, once at least from
    `history[confirm_from]` on (the steps of this server start, when the history pools earlier
    starts: planner.sweep.point). A concurrency disturbed more than `disturbed_retries` times
    ends the search.
    """
    if start < 1:
        raise ValueError("start must be >= 1")
    if upper is not None and upper < 1:
        raise ValueError("upper must be >= 1")
    probes = as_probes(history)
    if not probes:
        return min(start, upper) if upper is not None else start
    nxt = _narrow(probes, upper, rel_precision)
    if nxt is not None:
        return _past_disturbed(probes, _past_unresolved(probes, nxt, upper), disturbed_retries)
    if not confirm and not confirm_from:
        return None
    lo = bracket(probes).max_passing
    if lo is not None and not is_confirmed(probes, lo, since=confirm_from):
        return _past_disturbed(probes, _past_unresolved(probes, lo, upper, confirming=True), disturbed_retries)
    return None


def _past_disturbed(probes: list[Probe], n: int | None, retries: int) -> int | None:
    """`n`, unless it was disturbed more than `retries` times: then the search stops there."""
    if n is None:
        return None
    return None if sum(1 for p in probes if p.concurrency == n and p.verdict == "disturbed") > retries else n


def disturbed(history: History) -> list[int]:
    """Concurrencies whose every step so far was disturbed (sorted)."""
    probes = as_probes(history)
    informed = {p.concurrency for p in probes if p.informative}
    return sorted({p.concurrency for p in probes if p.verdict == "disturbed"} - informed)


def is_confirmed(history: History, concurrency: int, *, since: int = 0) -> bool:
    """Whether `concurrency` passed twice, and at least once from `history[since]` on."""
    passes = [i for i, p in enumerate(as_probes(history)) if p.concurrency == concurrency and p.passed]
    return len(passes) >= 2 and passes[-1] >= since


def unresolved(history: History) -> list[int]:
    """Concurrencies whose every step so far was unresolved (sorted)."""
    probes = as_probes(history)
    informed = {p.concurrency for p in probes if p.informative}
    return sorted({p.concurrency for p in probes if p.verdict == "unresolved"} - informed)


def _past_unresolved(probes: list[Probe], n: int, upper: int | None, *, confirming: bool = False) -> int | None:
    """`n`, unless it stayed unresolved too often: then a higher concurrency below the lowest
    failure (more completions per second, so a window resolves sooner), or None: the search
    stops there and the caller names the unresolved steps."""

    def misses(c: int) -> int:
        return sum(1 for p in probes if p.concurrency == c and p.verdict == "unresolved")

    if misses(n) <= UNRESOLVED_RETRIES:
        return n
    if confirming:
        # The highest pass could not be measured again in time: the caller reports it unconfirmed.
        return None
    ceilings = [c for c in (bracket(probes).min_failing, None if upper is None else upper + 1) if c is not None]
    limit = min(ceilings) if ceilings else 2 * n + 1
    higher = n
    while (nxt := min(max(higher + 1, math.ceil(1.5 * higher)), limit - 1)) > higher:
        higher = nxt
        if any(p.concurrency == higher and p.informative for p in probes):
            return None
        if misses(higher) <= UNRESOLVED_RETRIES:
            return higher
    return None


def _narrow(probes: list[Probe], upper: int | None, rel_precision: float) -> int | None:
    informative = [p for p in probes if p.informative]
    if not informative:
        # Only unresolved steps so far: measure the last one again (with a longer window).
        return probes[-1].concurrency
    b = bracket(informative)
    lo = b.max_passing or 0
    if b.min_failing is None:
        if upper is not None and lo >= upper:
            return None
        nxt = max(lo * 2, 1)
        return min(nxt, upper) if upper is not None else nxt
    hi = b.min_failing
    if hi <= 1 or converged(lo, hi, rel_precision):
        return None
    tried = {p.concurrency for p in informative}
    # A failed confirmation (or any repeat that did not pass) makes the lowest failure a load
    # that also passed, or one just below a pass (within two precision steps; a pass far above is
    # noise and ignored): the steps disagree there and the knee is close below it, whatever the
    # bracket's lower end, so the next probe is one precision step down (replay.search.pass_fit
    # reads the answer from every step).
    near = hi + max(1, math.ceil(2 * rel_precision * hi))
    if any(hi <= p.concurrency <= near and p.passed for p in informative):
        below = hi - max(1, math.ceil(rel_precision * hi))
        if lo < below and below not in tried:
            return below
    step = max(1, math.ceil(rel_precision * lo))
    model = predicted_knee(informative)
    candidate: int | None = None
    if model is not None and not _creeping(informative):
        candidate = math.floor(model)
        if candidate <= lo + step:
            # The model puts the knee at the highest pass: close the bracket from above.
            candidate = lo + step
        if candidate >= hi:
            candidate = None
    if candidate is None or candidate in tried:
        if model is not None and b.max_passing is None:
            candidate = _step_down(hi, _fails_since_last_pass(informative))
        else:
            candidate = (lo + hi) // 2
    if candidate in tried or candidate <= lo or candidate >= hi:
        return None
    return candidate


def _step_down(hi: int, failures: int) -> int:
    """Below the lowest failure when nothing has passed yet and the model has nothing untried to
    offer (it puts the knee just under a step that failed or was inconclusive): a step of 10% of
    it, doubling with each further failure, up to bisection. Halving at once would measure where
    a step is dearest and says least, far below a knee the model places close by."""
    fraction = min(0.5, 0.1 * 2 ** max(0, failures - 2))
    return min(hi - 1, math.floor(hi * (1.0 - fraction)))


def _fails_since_last_pass(probes: Sequence[Probe]) -> int:
    """The conclusive failures since the last pass, newest first: how far the step down doubles.
    An inconclusive step neither counts nor stops the count: it read close to its bound, which
    says the knee is near, not far below. (Counting every failure of the search, a descent
    below a contested load, whose repeats came out inconclusive, halved from 32 to 16 in the
    repeatability benchmark, on the strength of failures at 66 and 50.)"""
    count = 0
    for p in reversed(probes):
        if p.passed:
            break
        count += p.verdict == "fail"
    return count


def _creeping(probes: list[Probe]) -> bool:
    """The last two probes, both taken once the knee was bracketed, landed on the same side: the
    model keeps under- or over-shooting (regula falsi creeping along one side of a cliff), so
    bisect once."""
    if len(probes) < 3:
        return False
    first, second = probes[-2], probes[-1]
    before = bracket(probes[:-2])
    if before.max_passing is None or before.min_failing is None:
        return False
    return first.passed == second.passed


def predicted_knee(probes: Sequence[Probe]) -> float | None:
    """The lowest concurrency at which any modelled rule's fitted ratio reaches 1, or None when no
    rule gives one."""
    rules = sorted({rule for p in probes for rule in p.ratios})
    crossings = [x for rule in rules if (x := rule_crossing(probes, rule)) is not None]
    return min(crossings) if crossings else None


def rule_crossing(probes: Sequence[Probe], rule: str) -> float | None:
    points: dict[int, list[float]] = {}
    for p in probes:
        ratio = p.ratios.get(rule)
        if ratio is not None and math.isfinite(ratio) and ratio >= 0:
            points.setdefault(p.concurrency, []).append(ratio)
    if not points:
        return None
    xs = sorted(points)
    fitted = isotonic([sum(points[x]) / len(points[x]) for x in xs], [len(points[x]) for x in xs])
    above = next((i for i, f in enumerate(fitted) if f > 1.0), None)
    if above is None:
        # The rule holds everywhere measured: it sets no knee inside the data.
        return None
    if above > 0:
        x0, x1, f0, f1 = xs[above - 1], xs[above], fitted[above - 1], fitted[above]
        return x0 + (1.0 - f0) * (x1 - x0) / (f1 - f0)
    # Every measured point broke the rule: extend below the lowest.
    distinct = [(x, f) for x, f in zip(xs, fitted)]
    if len(distinct) >= 2:
        (x0, f0), (x1, f1) = distinct[0], next(((x, f) for x, f in distinct[1:] if f > distinct[0][1]), (None, None))
        if x1 is not None:
            slope = (f1 - f0) / (x1 - x0)
            crossing = x0 - (f0 - 1.0) / slope
            if crossing > 0:
                # A nearly flat line crosses far below the knee: no deeper than half the
                # proportional estimate (the module docstring, item 3).
                return max(crossing, x0 / f0 / 2)
    x0, f0 = distinct[0]
    return x0 / f0 if f0 > 0 else None


def knee_interval(verdicts: Sequence[tuple[int, str]]) -> list[int | None]:
    """[highest conclusive pass, lowest conclusive fail] from (concurrency, verdict) pairs. A pass
    counts only below every step that did not pass (a fail, an inconclusive window, a knee
    confirmation that did not hold): above one, a pass is noise, as it is for the search. An
    unresolved step says nothing either way."""
    verdicts = [(c, v) for c, v in verdicts if v not in NO_INFORMATION]
    fails = [c for c, v in verdicts if v == "fail"]
    not_passed = [c for c, v in verdicts if v != "pass"]
    below = min(not_passed) if not_passed else None
    passes = [c for c, v in verdicts if v == "pass" and (below is None or c < below)]
    return [max(passes) if passes else None, min(fails) if fails else None]
