"""[sweep] strategy = "adaptive": measure where a point could still win.

The points run in the order of their upper bound per GPU, highest first (the estimate's KV pool
over the corpus when it predicts one; else the memory flags, largest pool first). Before each
launch, against the best confirmed safe concurrency per GPU so far ("the best"):

1. Exact dominance. A point's answer can never exceed its search ceiling (the KV pool over the
   corpus, or [replay] max_concurrency), so its safe concurrency per GPU is at most
   floor(ceiling x (1 - headroom)) / GPUs. When that is at or below the best, the point cannot win:
   it is `dominated`, with its bound and the point that dominates it. A ceiling the sweep knows
   before launch ([replay] max_concurrency) settles it unlaunched; the KV pool is read from the
   point's server (planner.sweep.adaptive_point), which then stops before any step. Estimates
   only order points: they never drop one.
2. Predicted, then verified. The first point of each speed class (planner.sweep.classes) is
   searched in full, and its steps give the class's law (planner.sweep.laws). Every later point
   of the class is predicted from it; when the prediction's upper end cannot beat the best, the
   point is `predicted` and not searched. Otherwise it runs: with its real KV ceiling read, the
   prediction is checked again, then verified by two steps (the predicted concurrency, one
   precision step above it) and the confirmation the search would take; a disagreement falls back
   to a full search of that point (counted: AdaptiveSummary.fallbacks).
   With [sweep] verify_predictions = "all", every later point of a class is launched and its
   prediction verified, dominated or not: a check of the speed-class assumption on the engine
   at hand, not a way to find the best faster.

The recommendation (planner.sweep.outcome.choose_best) only ever picks a point with status "ok":
measured at its concurrency, searched or verified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.sweep.adaptive_point import interval_text, mark_dominated
from planner.sweep.classes import SpeedClass, class_of, speed_classes
from planner.sweep.config import SweepSettings
from planner.sweep.duration import mean_request_tokens
from planner.sweep.executor import Executor, SweepContext, Todo
from planner.sweep.grid import Point
from planner.sweep.laws import fit_law, predict, safe_per_gpu, waiting_allowed
from planner.sweep.results import AdaptiveSummary, ClassLaw, Dominance, PointPlan, PointResult, SpeedClassInfo, SweepResults
from planner.vllm_args import fixed_flags
from replay.corpus.jsonl import Corpus


def record_classes(results: SweepResults, points: Sequence[Point], settings: SweepSettings) -> dict[str, SpeedClass]:
    """Name each point's speed class in the results (both strategies); the classes by point id."""
    found = speed_classes(points, settings.sweep.memory_only_flags)
    results.strategy = settings.sweep.strategy
    results.speed_classes = [SpeedClassInfo(id=c.id, label=c.label(), point_ids=list(c.point_ids)) for c in found]
    by_point = class_of(points, settings.sweep.memory_only_flags)
    for result in results.points:
        if result.id in by_point:
            result.speed_class = by_point[result.id].id
    return by_point


def finish(results: SweepResults) -> None:
    """Once the points ran: a point reused from a file written before `answer_source` says it was
    searched (a point searched now says so when it concludes: planner.sweep.outcome.conclude),
    and the adaptive strategy's counts."""
    for p in results.points:
        if p.status == "ok" and p.answer_source is None:
            p.answer_source = "searched"
    if results.strategy != "adaptive":
        return
    counts = AdaptiveSummary()
    for p in results.points:
        if p.answer_source is not None:
            setattr(counts, p.answer_source, getattr(counts, p.answer_source) + 1)
        if p.knee_prediction is not None and p.knee_prediction.verified is False:
            counts.fallbacks += 1
    results.adaptive = counts


def max_num_seqs_of(point: Point, settings: SweepSettings) -> int | None:
    value = point.config.get("max_num_seqs", fixed_flags(settings.server.args).get("max_num_seqs"))
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except ValueError:
        return None


def _memory_rank(point: Point) -> tuple:
    """Larger pools first when no estimate orders the points: the memory flags, largest first."""
    c = point.config

    def num(key: str, default: float) -> float:
        value = c.get(key)
        if value is None or isinstance(value, bool):
            return default
        text = str(value).strip()
        units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        try:
            return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
        except ValueError:
            return default

    # Both are per GPU in vLLM (each worker holds its share of the KV heads).
    return (
        -num("kv_cache_memory_bytes", 0),
        -num("num_gpu_blocks_override", 0),
        -num("gpu_memory_utilization", 0),
        -num("max_num_seqs", math.inf),
        num("max_model_len", 0),
        point.gpus,
    )


def corpus_mean_tokens(corpus: Corpus, settings: SweepSettings) -> float | None:
    """A corpus request's mean length in tokens, counted roughly (planner.sweep.duration)."""
    return mean_request_tokens(corpus.requests, settings.replay.max_tokens or 16)


def launch_order(todo: Todo, settings: SweepSettings, mean: float | None) -> Todo:
    """Highest estimated upper bound per GPU first (the estimate's KV tokens over `mean`, a corpus
    request's tokens); points the estimate cannot size after them, by their memory flags. The
    order decides how early a point can dominate others, never whether one is dropped."""
    cap = settings.replay.max_concurrency

    def estimated(point: Point, result: PointResult) -> float | None:
        if not result.kv_cache_tokens_predicted or not mean:
            return None
        bound = result.kv_cache_tokens_predicted / mean
        for limit in (cap, max_num_seqs_of(point, settings)):
            if limit is not None:
                bound = min(bound, limit)
        return bound / point.gpus

    def key(item: tuple[Point, PointResult]) -> tuple:
        bound = estimated(*item)
        return (bound is None, -(bound or 0.0), _memory_rank(item[0]), item[0].index)

    return sorted(todo, key=key)


def best_confirmed(points: Sequence[PointResult], *, confirm: bool) -> PointResult | None:
    """The point the recommendation would pick now, among answers that are confirmed."""
    done = [
        p for p in points
        if p.status == "ok" and p.safe_concurrency_per_gpu and (p.confirmed or not confirm)
    ]
    return max(done, key=lambda p: (p.safe_concurrency_per_gpu or 0.0, p.output_tokens_per_s_per_gpu or 0.0), default=None)


class AdaptivePlanner:
    """Decides, point by point, what the adaptive strategy does with the grid."""

    def __init__(
        self, settings: SweepSettings, classes: dict[str, SpeedClass], grid: Sequence[Point], results: Sequence[PointResult]
    ) -> None:
        self.settings = settings
        self.classes = classes
        self.laws: dict[str, ClassLaw] = {}
        self.headroom = settings.slo.headroom
        self.slo = settings.slo.rules()
        # The law reads a failure above a point's max_num_seqs as possibly queueing (laws.fit_law).
        self._max_num_seqs_by_id = {p.id: max_num_seqs_of(p, settings) for p in grid}
        for r in results:
            self.learn(r)

    def learn(self, result: PointResult) -> None:
        """A point searched in full and confirmed gives its class's law, or a better one: a law
        with a pass replaces one without, and a law that found the latency knee (a failure) one
        that stopped at a cap of its own point."""
        cls = self.classes.get(result.id)
        if cls is None or result.status != "ok" or result.answer_source not in ("searched", None):
            return
        if self.settings.replay.confirm_knee and not result.confirmed:
            return
        new = fit_law(
            result, self.slo, cls.id, max_num_seqs=self._max_num_seqs_by_id.get(result.id),
            max_concurrency=self.settings.replay.max_concurrency,
        )
        old = self.laws.get(cls.id)
        if old is None or (old.max_passing is None and new.max_passing is not None) or (
            old.min_failing is None and new.min_failing is not None
        ):
            self.laws[cls.id] = new

    def settle_before_launch(self, point: Point, result: PointResult, best: PointResult | None) -> bool:
        """Whether the point is settled without a launch (dominated by [replay] max_concurrency, or
        predicted by its class's law), setting its result."""
        if best is None or best.safe_concurrency_per_gpu is None or self.verify_all:
            return False
        beat, by = best.safe_concurrency_per_gpu, best.id
        cap = self.settings.replay.max_concurrency
        if cap is not None and (bound_safe := safe_per_gpu(cap, self.headroom, point.gpus) or 0.0) <= beat:
            mark_dominated(
                result, Dominance(
                    by=by, by_safe_concurrency_per_gpu=beat, bound=cap, bound_source="max_concurrency",
                    bound_safe_concurrency_per_gpu=bound_safe,
                ), f"[replay] max_concurrency {cap}",
            )
            return True
        law = self.laws.get(self.classes[point.id].id)
        if law is None or self.queues_beyond_law(point):
            return False
        prediction = predict(law, kv_ceiling=None, max_num_seqs=self._max_num_seqs(point), max_concurrency=cap)
        if prediction is None:
            return False
        top = prediction.interval[1]
        top_safe = safe_per_gpu(top, self.headroom, point.gpus) if top is not None else None
        if top_safe is None or top_safe > beat:
            return False
        result.knee_prediction = prediction
        result.status = result.answer_source = "predicted"
        # Not started, so its KV pool was never read: a pool smaller than the law's point can only
        # lower its answer, so the prediction is a ceiling, and the note says so.
        unread = "" if prediction.kv_pool_read else "; its KV pool was not read, which can only lower it"
        result.answer_note = (
            f"predicted by class {prediction.speed_class}'s law (from {prediction.law_from}), not started:"
            f" max passing {prediction.concurrency} in {interval_text(prediction.interval)}"
            f" ({prediction.limit}){unread}, at most {top_safe:g} safe per GPU; {by} has {beat:g} confirmed"
        )
        return True

    def plan(self, point: Point, best: PointResult | None) -> PointPlan:
        cls = self.classes[point.id].id
        return PointPlan(
            beat_safe_concurrency_per_gpu=None if best is None else best.safe_concurrency_per_gpu,
            beat_by=None if best is None else best.id,
            law=None if self.queues_beyond_law(point) else self.laws.get(cls),
            speed_class=cls,
            max_num_seqs=self._max_num_seqs(point),
            max_concurrency=self.settings.replay.max_concurrency,
            verify_all=self.verify_all,
        )

    @property
    def verify_all(self) -> bool:
        return self.settings.sweep.verify_predictions == "all"

    def _max_num_seqs(self, point: Point) -> int | None:
        # It caps what passes only when the SLOs bound the requests that wait for a slot.
        waiting = waiting_allowed(self.slo)
        seqs = max_num_seqs_of(point, self.settings)
        return None if waiting is None or seqs is None else seqs + math.floor(waiting)

    def queues_beyond_law(self, point: Point) -> bool:
        """Whether the point's requests would queue where its class's law passes: its max_num_seqs
        is below the law's highest pass and the SLOs do not bound waiting. The law, measured
        without a queue, does not describe such a point, so it is searched in full."""
        law = self.laws.get(self.classes[point.id].id)
        seqs = max_num_seqs_of(point, self.settings)
        return (
            law is not None and law.max_passing is not None and seqs is not None
            and waiting_allowed(self.slo) is None and seqs < law.max_passing
        )  # fmt: skip


async def run_adaptive(
    executor: Executor,
    ctx: SweepContext,
    todo: Todo,
    *,
    grid: Sequence[Point],
    classes: dict[str, SpeedClass],
    corpus: Corpus,
    slots: int,
) -> None:
    """Run the adaptive strategy over `todo` (the points not reused or refused), up to `slots` GPUs'
    worth of points at a time. A point waits while another point of its class that has no law yet
    runs, since that one's search may settle it."""
    settings = ctx.shared.settings
    planner = AdaptivePlanner(settings, classes, grid, ctx.results.points)
    pending = launch_order(todo, settings, corpus_mean_tokens(corpus, settings))
    while pending:
        best = best_confirmed(ctx.results.points, confirm=settings.replay.confirm_knee)
        batch: Todo = []
        learning: set[str] = set()
        used = 0
        for point, result in list(pending):
            cls = classes[point.id].id
            if planner.settle_before_launch(point, result, best):
                pending.remove((point, result))
                continue
            if cls in learning or (batch and used + point.gpus > slots):
                continue
            if cls not in planner.laws:
                learning.add(cls)
            result.plan = planner.plan(point, best)
            batch.append((point, result))
            pending.remove((point, result))
            used += point.gpus
        ctx.save()
        if not batch:
            continue
        await executor.run(ctx, batch)
        for _, result in batch:
            planner.learn(result)
    _record_laws(ctx.results, planner.laws)


def _record_laws(results: SweepResults, laws: dict[str, ClassLaw]) -> None:
    for info in results.speed_classes:
        info.law = laws.get(info.id, info.law)
