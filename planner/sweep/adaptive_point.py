"""One point as the adaptive strategy runs it (planner.sweep.adaptive plans it; planner.sweep.point
runs it and calls in here at two places):

1. Once its server has started and its search ceiling is known (the KV pool over the corpus):
   `settled_by_bound` ends a point whose ceiling cannot beat the best confirmed answer so far
   (dominated), or whose class's law, with its real ceiling, says it cannot (predicted). Under
   [sweep] verify_predictions = "all" it ends none, and only sets the prediction to verify.
2. In place of the search: `planned_search` verifies the class's prediction with two steps, at
   the predicted concurrency and one precision step above it (then confirms the pass as the
   search would), and falls back to a full search from there when they disagree.

Both read the point's PointPlan (result.plan), which travels with the result to where it runs.
"""

from __future__ import annotations

import math

from planner.sweep.laws import predict, safe_per_gpu
from planner.sweep.results import Dominance, PointResult
from replay.load.kinds import Concurrency
from replay.run.runner import Replay, SearchOutcome
from replay.search.policy import bracket
from replay.search.verdicts import concurrency_history, probe_of


def mark_dominated(result: PointResult, dominance: Dominance, ceiling: str) -> None:
    """Settle `result` as dominated: `ceiling` names what bounds it ("its KV ceiling of 59 requests")."""
    result.status = result.answer_source = "dominated"
    result.dominance = dominance
    result.answer_note = (
        f"dominated by {dominance.by}: {ceiling} gives at most {dominance.bound_safe_concurrency_per_gpu:g} safe"
        f" per GPU, and {dominance.by} has {dominance.by_safe_concurrency_per_gpu:g} confirmed"
    )


def settled_by_bound(result: PointResult, upper: int, *, gpus: int, headroom: float) -> bool:
    """Whether the point ends here, unsearched: dominated by its own ceiling `upper`, or predicted
    by its class's law with that ceiling. Sets its status and says why."""
    plan = result.plan
    if plan is None:
        return False
    beat, by = plan.beat_safe_concurrency_per_gpu, plan.beat_by or "-"
    # [sweep] verify_predictions = "all": never settled unsearched; the law's prediction, with the
    # real ceiling, is what the steps verify.
    ceiling_safe = safe_per_gpu(upper, headroom, gpus) or 0.0
    if not plan.verify_all and beat is not None and ceiling_safe <= beat:
        mark_dominated(
            result, Dominance(
                by=by, by_safe_concurrency_per_gpu=beat, bound=upper, bound_source="server_kv_pool",
                bound_safe_concurrency_per_gpu=ceiling_safe,
            ), f"its KV ceiling of {upper} requests",
        )
        return True
    if plan.law is None:
        return False
    prediction = predict(plan.law, kv_ceiling=upper, max_num_seqs=plan.max_num_seqs, max_concurrency=plan.max_concurrency)
    result.knee_prediction = prediction
    if plan.verify_all or prediction is None or beat is None:
        return False
    top = prediction.interval[1]
    top_safe = safe_per_gpu(top, headroom, gpus) if top is not None else None
    if top_safe is not None and top_safe <= beat:
        result.status = result.answer_source = "predicted"
        result.answer_note = (
            f"predicted by class {prediction.speed_class}'s law (from {prediction.law_from}): max passing"
            f" {prediction.concurrency} in {interval_text(prediction.interval)}, at most {top_safe:g} safe per GPU;"
            f" {by} has {beat:g} confirmed"
        )
        return True
    return False


async def planned_search(
    replay: Replay, result: PointResult, *, start: int, upper: int, precision: float, confirm: bool
) -> SearchOutcome:
    """Verify the point's prediction (set by settled_by_bound) when it has one, else search in
    full; a verification that disagrees goes on as a full search over the steps it took."""
    prediction = result.knee_prediction
    if prediction is None:
        result.answer_source = "searched"
        return await replay.search(start=start, upper=upper)
    p = min(prediction.concurrency, upper)
    agreed = await _passes(replay, p, if_unresolved=False)
    if agreed and p < upper:
        above = min(upper, p + max(1, math.ceil(precision * p)))
        agreed = not await _passes(replay, above, if_unresolved=True)
    if agreed and confirm:
        agreed = await _passes(replay, p, if_unresolved=False)
    prediction.verified = agreed
    if not agreed:
        result.answer_source = "searched"
        return await replay.search(start=start, upper=upper)
    result.answer_source = "verified"
    b = bracket(concurrency_history(replay.steps))
    return SearchOutcome(max_passing=b.max_passing, min_failing=b.min_failing)


async def _passes(replay: Replay, concurrency: int, *, if_unresolved: bool) -> bool:
    """Whether a step at `concurrency` passed (an inconclusive step did not). An unresolved step
    says nothing, and a verification cannot stand on it: the caller gives `if_unresolved`, the
    answer that ends the verification in a full search."""
    probe = probe_of(await replay.step(Concurrency(concurrency)))
    return probe.passed if probe.informative else if_unresolved


def interval_text(interval: list[int | None]) -> str:
    lo, hi = interval
    return f"[{lo}, {'-' if hi is None else hi}]"
