"""The adaptive strategy's pure parts: speed classes, the launch order, exact dominance, the class
law and its predictions, and a verification that disagrees (planner.sweep.classes, laws,
adaptive, adaptive_point)."""

from __future__ import annotations

import asyncio
import math
import random
from types import SimpleNamespace

import pytest

from planner.errors import ConfigError
from planner.sweep.adaptive import AdaptivePlanner, best_confirmed, finish, launch_order
from planner.sweep.adaptive_point import planned_search, settled_by_bound
from planner.sweep.classes import class_of, speed_classes
from planner.sweep.config import DEFAULT_MEMORY_ONLY_FLAGS, SweepSettings, load_settings
from planner.sweep.grid import expand
from planner.sweep.laws import fit_law, kv_knee, predict, safe_per_gpu
from planner.sweep.results import ClassLaw, PointPlan, PointResult, SweepResults
from replay.results import ClientSummary, LatencySummary, LoadSpec, ServerSummary, StepResult
from replay.run.runner import SearchOutcome

SLO = {"tpot_p50_ms": 100.0, "ttft_p99_ms": 500.0, "max_preemptions": 0.0}


def settings(slo: dict[str, float] | None = None, **sweep) -> SweepSettings:
    grid = sweep.pop("grid", {})
    return SweepSettings(server={"model": "m"}, grid=grid, sweep=sweep, slo={**SLO, **(slo or {}), "headroom": 0.2})


def step(c: int, verdict: str, tpot_ms: float = 50.0, violations: tuple[str, ...] = ()) -> StepResult:
    return StepResult(
        load=LoadSpec(mode="concurrency", value=c), started_at="t", warmup_requests=c, window_s=1.0,
        requests_ok=30, requests_failed=0, ttft_ms=LatencySummary(p99=10.0), itl_ms=LatencySummary(),
        tpot_ms=LatencySummary(p50=tpot_ms), e2e_ms=LatencySummary(), requests_per_s=1.0, input_tokens_per_s=1.0,
        output_tokens_per_s=10.0 * c, tokens_source="usage", server=ServerSummary(), client=ClientSummary(),
        slo_pass=verdict == "pass", slo_verdict=verdict, slo_violations=list(violations),
    )


def result(pid: str, **over) -> PointResult:
    return PointResult(**{"id": pid, "config": {}, "command": [], "status": "pending", "fingerprint": pid, **over})


# Speed classes ---------------------------------------------------------------------------------

def test_points_that_differ_only_in_memory_flags_share_a_class():
    s = settings(grid={
        "max_model_len": [2048, 4096], "tensor_parallel_size": [1, 2],
        "extra": {"max_num_seqs": [8, 64], "max_num_batched_tokens": [2048, 8192]},
    })
    points = expand(s)
    classes = speed_classes(points, s.sweep.memory_only_flags)
    # tp x max_num_batched_tokens name the classes; mml x max_num_seqs are the memory variants.
    assert [c.label() for c in classes] == [
        "max_num_batched_tokens=2048, tensor_parallel_size=1", "max_num_batched_tokens=8192, tensor_parallel_size=1",
        "max_num_batched_tokens=2048, tensor_parallel_size=2", "max_num_batched_tokens=8192, tensor_parallel_size=2",
    ]
    assert [len(c.point_ids) for c in classes] == [4, 4, 4, 4]
    by_point = class_of(points, s.sweep.memory_only_flags)
    for p in points:
        same = [q for q in points if by_point[q.id] == by_point[p.id]]
        assert {(q.config["tensor_parallel_size"], q.config["max_num_batched_tokens"]) for q in same} == {
            (p.config["tensor_parallel_size"], p.config["max_num_batched_tokens"])
        }


def test_env_axes_and_overridden_lists_name_classes():
    s = settings(grid={"extra": {"max_num_seqs": [8, 64]}, "env": {"VLLM_ATTENTION_BACKEND": ["FLASH", "XFORMERS"]}})
    assert [c.label() for c in speed_classes(expand(s), s.sweep.memory_only_flags)] == [
        "env VLLM_ATTENTION_BACKEND=FLASH", "env VLLM_ATTENTION_BACKEND=XFORMERS",
    ]
    # max_num_seqs no longer memory-only: it names classes too (dash form accepted).
    s = settings(grid={"extra": {"max_num_seqs": [8, 64]}}, memory_only_flags=["--gpu-memory-utilization"])
    assert s.sweep.memory_only_flags == ["gpu_memory_utilization"]
    assert len(speed_classes(expand(s), s.sweep.memory_only_flags)) == 2
    # One class when nothing but memory varies.
    s = settings(grid={"gpu_memory_utilization": [0.8, 0.9]})
    (only,) = speed_classes(expand(s), s.sweep.memory_only_flags)
    assert only.label() == "every point" and len(only.point_ids) == 2


def test_strategy_defaults_to_adaptive_and_bad_keys_are_named(tmp_path):
    s = SweepSettings(server={"model": "m"})
    assert s.sweep.strategy == "adaptive" and tuple(s.sweep.memory_only_flags) == DEFAULT_MEMORY_ONLY_FLAGS
    cfg = tmp_path / "s.toml"
    cfg.write_text('[server]\nmodel = "m"\n[sweep]\nstrategy = "greedy"\n')
    with pytest.raises(ConfigError, match=r"s.toml:4: sweep.strategy: Input should be 'exhaustive' or 'adaptive'"):
        load_settings(cfg)
    cfg.write_text('[server]\nmodel = "m"\n[sweep]\nmemory_only_flags = ["tensor_parallel_size"]\n')
    with pytest.raises(ConfigError, match="changes a step's speed; it cannot be memory-only"):
        load_settings(cfg)


# Order and dominance -----------------------------------------------------------------------------

def test_launch_order_puts_the_highest_bound_per_gpu_first():
    s = settings(grid={"tensor_parallel_size": [1, 2], "extra": {"kv_cache_memory_bytes": ["4M", "64M"], "max_num_seqs": [4, 256]}})
    points = expand(s)
    todo = [(p, result(p.id)) for p in points]

    def shape(item) -> tuple:
        c = item[0].config
        return (c["tensor_parallel_size"], c["kv_cache_memory_bytes"], c["max_num_seqs"])

    # Without an estimate: the memory flags (per GPU in vLLM), largest pool first, fewer GPUs first.
    assert [shape(i) for i in launch_order(todo, s, 200.0)] == [
        (1, "64M", 256), (2, "64M", 256), (1, "64M", 4), (2, "64M", 4),
        (1, "4M", 256), (2, "4M", 256), (1, "4M", 4), (2, "4M", 4),
    ]
    # With an estimate it decides: KV tokens over the corpus's mean request (200 tokens),
    # capped by max_num_seqs, per GPU.
    for p, r in todo:
        r.kv_cache_tokens_predicted = 200 * (1000 if p.config["kv_cache_memory_bytes"] == "64M" else 30) * p.gpus
    assert [shape(i) for i in launch_order(todo, s, 200.0)][:4] == [(1, "64M", 256), (2, "64M", 256), (1, "4M", 256), (2, "4M", 256)]


@pytest.mark.parametrize("seed", range(5))
def test_dominance_never_drops_a_point_that_could_have_won(seed):
    """Random points (a ceiling, a true max passing at or below it, 1-4 GPUs): whenever the rule
    dominates a point against a confirmed best, the point's true safe concurrency per GPU is at or
    below the best's. The rule reads only the ceiling, which the answer never exceeds."""
    rng = random.Random(seed)
    for _ in range(500):
        gpus = rng.choice([1, 2, 4])
        ceiling = rng.randint(1, 400)
        true_max_passing = rng.randint(0, ceiling)
        beat = rng.randint(1, 200) / rng.choice([1, 2, 4])
        r = result("p", plan=PointPlan(beat_safe_concurrency_per_gpu=beat, beat_by="best"))
        if settled_by_bound(r, ceiling, gpus=gpus, headroom=0.2):
            assert r.status == r.answer_source == "dominated"
            assert (safe_per_gpu(true_max_passing, 0.2, gpus) or 0) <= beat
            assert r.dominance.bound == ceiling and r.dominance.by == "best"
        else:
            assert safe_per_gpu(ceiling, 0.2, gpus) > beat


def test_a_dominated_point_says_by_whom_and_its_bound():
    r = result("02", plan=PointPlan(beat_safe_concurrency_per_gpu=8.0, beat_by="01"))
    assert settled_by_bound(r, 10, gpus=1, headroom=0.2)  # floor(10 x 0.8) = 8 reaches 8
    assert r.dominance.model_dump() == {
        "by": "01", "by_safe_concurrency_per_gpu": 8.0, "bound": 10, "bound_source": "server_kv_pool",
        "bound_safe_concurrency_per_gpu": 8.0,
    }
    assert r.answer_note == "dominated by 01: its KV ceiling of 10 requests gives at most 8 safe per GPU, and 01 has 8 confirmed"
    r = result("03", plan=PointPlan(beat_safe_concurrency_per_gpu=8.0, beat_by="01"))
    assert not settled_by_bound(r, 12, gpus=1, headroom=0.2) and r.status == "pending"


# The law and its predictions ---------------------------------------------------------------------

def searched(pid: str = "01", steps=None) -> PointResult:
    steps = steps or [step(40, "fail", 140, ("tpot_p50_ms",)), step(20, "pass", 70), step(28, "pass", 98),
                      step(30, "fail", 105, ("tpot_p50_ms",)), step(28, "pass", 98)]
    return result(pid, status="ok", steps=steps, answer_source="searched", confirmed=True,
                  safe_concurrency_per_gpu=22.0, max_passing_concurrency=28)


def test_the_law_carries_the_searched_interval_and_each_rules_fit():
    law = fit_law(searched(), SLO, "c1", max_num_seqs=None)
    assert (law.max_passing, law.min_failing) == (28, 30)
    assert law.fitted["tpot_p50_ms"] == [[20, 0.7], [28, 0.98], [30, 1.05], [40, 1.4]]
    assert law.crossings["tpot_p50_ms"] == pytest.approx(28 + 0.02 / 0.07 * 2, abs=1e-3)
    assert law.knee == law.crossings["tpot_p50_ms"]


def test_a_failure_of_memory_or_of_waiting_is_not_the_classes():
    preempted = [step(40, "fail", 50, ("max_preemptions",)), step(20, "pass", 40), step(20, "pass", 40)]
    assert fit_law(searched(steps=preempted), SLO, "c1", max_num_seqs=None).min_failing is None
    # A failure above the point's max_num_seqs may be requests waiting for a slot (TTFT sees it).
    assert fit_law(searched(), SLO, "c1", max_num_seqs=16).min_failing is None
    assert fit_law(searched(), SLO, "c1", max_num_seqs=30).min_failing == 30


def test_a_law_whose_search_met_its_kv_pool_predicts_each_pools_knee_at_the_same_overflow_chance():
    # vLLM's CPU build, 32M pool x 64 seqs: ceiling 59, passed 47, failed 49 on its pool's rules.
    kv = ("max_preemptions", "kv_cache_usage_max")
    steps = [step(59, "fail", 60, kv), step(42, "pass"), step(49, "fail", 55, kv), step(47, "pass"), step(47, "pass")]
    law = fit_law(searched(steps=steps).model_copy(update={"search_upper_bound": 59}), SLO, "c1", max_num_seqs=64)
    assert law.min_failing is None and law.kv_knee_fraction == [round(47 / 59, 4), round(48 / 59, 4)]
    assert law.kv_knee_ceiling == 59
    # The 16M pool (ceiling 29) measured 23 in two full searches; its ceiling alone said 29. At the
    # law's overflow chance, 12 requests short of 59 at 47 (1.75 sqrt(47)) is 1.75 sqrt(n) short
    # of 29: n = 20; the same share (0.80) says 23, the interval's top.
    p = predict(law, kv_ceiling=29, max_num_seqs=64, max_concurrency=None)
    assert (p.concurrency, p.interval, p.limit) == (20, [20, 23], "kv_knee")
    # The 8M pool (14) measured 10 and 9.
    assert predict(law, kv_ceiling=14, max_num_seqs=64, max_concurrency=None).interval == [8, 11]
    # The second run's law point, 51 of 59: 23 (measured 23) and 10 (measured 9).
    law51 = law.model_copy(update={"kv_knee_fraction": [round(51 / 59, 4), round(52 / 59, 4)]})
    assert predict(law51, kv_ceiling=29, max_num_seqs=64, max_concurrency=None).interval == [23, 25]
    assert predict(law51, kv_ceiling=14, max_num_seqs=64, max_concurrency=None).interval == [10, 12]
    # At the law's own ceiling both readings are the law's; a file without the ceiling keeps the share.
    assert kv_knee([0.8, 0.8136], 59, 59) == (47, 48)
    assert predict(law.model_copy(update={"kv_knee_ceiling": None}), kv_ceiling=29, max_num_seqs=64, max_concurrency=None).interval == [23, 23]
    # A lower cap still wins; a larger pool than the law's is above what the law knows.
    assert predict(law, kv_ceiling=29, max_num_seqs=16, max_concurrency=None).limit == "max_num_seqs"
    assert predict(law, kv_ceiling=120, max_num_seqs=None, max_concurrency=None) is None
    # A ceiling [replay] max_concurrency set, or a failure that may be queueing, is not the pool's.
    capped = searched(steps=steps).model_copy(update={"search_upper_bound": 59})
    assert fit_law(capped, SLO, "c1", max_num_seqs=None, max_concurrency=59).kv_knee_fraction is None
    assert fit_law(capped, SLO, "c1", max_num_seqs=48).kv_knee_fraction is None
    # A latency failure says nothing of the pool.
    assert fit_law(searched().model_copy(update={"search_upper_bound": 59}), SLO, "c1", max_num_seqs=None).kv_knee_fraction is None


def test_predictions_take_the_lowest_cap_and_carry_the_interval():
    law = ClassLaw(speed_class="c1", from_point="01", max_passing=28, min_failing=31, knee=29.5)
    p = predict(law, kv_ceiling=None, max_num_seqs=None, max_concurrency=None)
    assert (p.concurrency, p.interval, p.limit) == (28, [28, 30], "latency")
    p = predict(law, kv_ceiling=29, max_num_seqs=None, max_concurrency=None)
    assert (p.concurrency, p.interval, p.limit, p.kv_pool_read) == (28, [28, 29], "latency", True)
    p = predict(law, kv_ceiling=100, max_num_seqs=8, max_concurrency=None)
    assert (p.concurrency, p.interval, p.limit) == (8, [8, 8], "max_num_seqs")
    # A law without a failure says nothing above its pass: no prediction where a point has room.
    open_law = law.model_copy(update={"min_failing": None})
    assert predict(open_law, kv_ceiling=100, max_num_seqs=None, max_concurrency=None) is None
    assert predict(open_law, kv_ceiling=20, max_num_seqs=None, max_concurrency=None).interval == [20, 20]


def one_class(slo: dict[str, float] | None = None, **sweep):
    """A one-class grid (max_num_seqs {64, 8} x pools {8M, 4M}) whose first point was searched:
    (points, planner, the searched point, the best confirmed)."""
    s = settings(slo, grid={"extra": {"max_num_seqs": [64, 8], "kv_cache_memory_bytes": ["8M", "4M"]}}, **sweep)
    points = expand(s)
    first = searched(points[0].id)
    planner = AdaptivePlanner(s, class_of(points, s.sweep.memory_only_flags), points, [first])
    return points, planner, first, best_confirmed([first], confirm=True)


def test_a_point_whose_prediction_cannot_beat_the_best_is_predicted_without_a_launch():
    # max_waiting = 0: no request may wait for a slot, so max_num_seqs caps what passes.
    points, planner, first, best = one_class({"max_waiting": 0})
    assert set(planner.laws) == {"c1"}
    capped = result(points[2].id)  # max_num_seqs 8: at most floor(8 x 0.8) = 6 safe
    assert planner.settle_before_launch(points[2], capped, best)
    assert capped.status == capped.answer_source == "predicted"
    assert capped.knee_prediction.interval == [8, 8] and capped.knee_prediction.limit == "max_num_seqs"
    assert "not started" in capped.answer_note and "01-" in capped.answer_note
    # Never started, its pool unread: the note calls the prediction what it is, a ceiling.
    assert not capped.knee_prediction.kv_pool_read
    assert "; its KV pool was not read, which can only lower it, at most 6 safe per GPU" in capped.answer_note
    # Its twin with room: the law's top is 29, floor(29 x 0.8) = 23 > 22: it could win, so it runs.
    roomy = result(points[1].id)
    assert not planner.settle_before_launch(points[1], roomy, best)
    plan = planner.plan(points[1], best)
    assert plan.law.from_point == first.id and plan.beat_safe_concurrency_per_gpu == 22.0 and plan.max_num_seqs == 64


def test_without_a_bound_on_waiting_a_point_that_would_queue_where_the_law_passes_is_searched_in_full():
    # TTFT p99 500 ms sees requests waiting for a slot but tolerates some: on vLLM's CPU build the
    # max_num_seqs 16 point passed 44 in flight. max_num_seqs 8 is below the law's pass (28), so
    # the law (measured without a queue) says nothing of it: launched, and searched in full.
    points, planner, first, best = one_class()
    capped = result(points[2].id)
    assert planner.queues_beyond_law(points[2]) and not planner.queues_beyond_law(points[1])
    assert not planner.settle_before_launch(points[2], capped, best) and capped.status == "pending"
    plan = planner.plan(points[2], best)
    assert plan.law is None and plan.max_num_seqs is None
    # Its twin with 64 seqs is predicted as before, max_num_seqs not a cap.
    assert planner.plan(points[1], best).law.from_point == first.id


def test_verify_predictions_all_launches_every_point_and_verifies_each_prediction(tmp_path):
    points, planner, first, best = one_class({"max_waiting": 0}, verify_predictions="all")
    # The max_num_seqs 8 twin cannot win, yet it runs, with the law to verify.
    capped = result(points[2].id)
    assert not planner.settle_before_launch(points[2], capped, best) and capped.status == "pending"
    capped.plan = planner.plan(points[2], best)
    assert capped.plan.verify_all and capped.plan.law.from_point == first.id
    # Its KV ceiling (10, at most 8 safe per GPU against 22) would dominate it: it is verified instead.
    assert not settled_by_bound(capped, 10, gpus=1, headroom=0.2)
    assert capped.status == "pending" and capped.dominance is None
    assert (capped.knee_prediction.concurrency, capped.knee_prediction.limit) == (8, "max_num_seqs")
    assert SweepSettings(server={"model": "m"}).sweep.verify_predictions == "could_win"
    cfg = tmp_path / "s.toml"
    cfg.write_text('[server]\nmodel = "m"\n[sweep]\nverify_predictions = "some"\n')
    with pytest.raises(ConfigError, match=r"s.toml:4: sweep.verify_predictions: Input should be 'could_win' or 'all'"):
        load_settings(cfg)


# Verification ----------------------------------------------------------------------------------

class ScriptedReplay:
    """A Replay whose steps pass or fail as scripted, and whose search records that it ran."""

    def __init__(self, verdicts: dict[int, str]) -> None:
        self.verdicts = verdicts
        self.steps: list[StepResult] = []
        self.searched = False

    async def step(self, load, window=None) -> StepResult:
        s = step(load.n, self.verdicts[load.n])
        self.steps.append(s)
        return s

    async def search(self, *, start: int, upper: int | None) -> SearchOutcome:
        self.searched = True
        return SearchOutcome(max_passing=33, min_failing=35)


def verifying(pred_concurrency: int = 28) -> PointResult:
    r = result("02", plan=PointPlan(law=ClassLaw(speed_class="c1", from_point="01", max_passing=28, min_failing=30, knee=29)))
    assert not settled_by_bound(r, 100, gpus=1, headroom=0.2)
    return r


def test_a_verification_that_agrees_takes_two_steps_and_the_confirmation():
    r = verifying()
    replay = ScriptedReplay({28: "pass", 30: "fail"})
    outcome = asyncio.run(planned_search(replay, r, start=100, upper=100, precision=0.05, confirm=True))
    assert [int(s.load.value) for s in replay.steps] == [28, 30, 28]
    assert (outcome.max_passing, outcome.min_failing) == (28, 30) and not replay.searched
    assert r.answer_source == "verified" and r.knee_prediction.verified is True


@pytest.mark.parametrize("verdicts", [{28: "fail"}, {28: "pass", 30: "pass"}, {28: "pass", 30: "unresolved"}])
def test_a_verification_that_disagrees_falls_back_to_a_full_search(verdicts):
    r = verifying()
    replay = ScriptedReplay(verdicts)
    outcome = asyncio.run(planned_search(replay, r, start=100, upper=100, precision=0.05, confirm=True))
    assert replay.searched and outcome.max_passing == 33
    assert r.answer_source == "searched" and r.knee_prediction.verified is False
    results = SweepResults(started_at="t", settings={}, strategy="adaptive", points=[r.model_copy(update={"status": "ok"})])
    finish(results)
    assert results.adaptive.fallbacks == 1 and results.adaptive.searched == 1


def test_older_files_load_with_the_new_fields_null():
    old = result("01", status="ok").model_dump(mode="json")
    for key in ("speed_class", "answer_source", "answer_note", "dominance", "knee_prediction", "plan"):
        old.pop(key)
    loaded = PointResult.model_validate(old)
    assert loaded.answer_source is None and loaded.dominance is None and loaded.knee_prediction is None


# The dry run ------------------------------------------------------------------------------------

def test_the_adaptive_dry_run_shows_classes_bounds_and_launch_order(offline_hub, capsys, tmp_path, monkeypatch):
    from pathlib import Path

    from planner.cli import main

    monkeypatch.setenv("PLANNER_SWEEP__STRATEGY", "adaptive")
    example = Path(__file__).resolve().parents[2] / "examples" / "h100-llama-70b-tp.toml"
    args = ["sweep", "--config", str(example), "--dry-run", "--request-duration-s", "20", "--output", str(tmp_path)]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()[9:]
    assert lines[1:3] == ["  c1: tensor_parallel_size=4: 2 points", "  c2: tensor_parallel_size=8: 2 points"]
    assert lines[3].startswith("strategy: adaptive: highest bound per GPU first")
    assert lines[4] == "plan, in launch order:"
    # tp 8 leaves each GPU more memory for the KV pool after its share of the weights: it runs first.
    assert [line.split(":")[0].strip() for line in lines[5:-1]] == ["02-mml16384-tp8", "04-mml65536-tp8", "01-mml16384-tp4", "03-mml65536-tp4"]
    assert all("class c2, upper bound ~" in line for line in lines[5:7])
    assert all("per GPU)" in line for line in lines[5:-1])
    # The plan's total: one full search per class (02 and 01 first in their class), the other
    # points verified in two steps, up to every point searched in full.
    assert lines[-1].startswith("expected total: adaptive ~") and "if every verification falls back to a full search" in lines[-1]


def test_resume_keeps_a_settled_point_under_adaptive_and_reruns_it_under_exhaustive(tmp_path):
    from planner.sweep.results import write_results
    from planner.sweep.run import previous_results, reusable

    dominated = result("02", status="dominated", answer_source="dominated")
    results = SweepResults(started_at="t", settings={}, points=[searched("01"), dominated, result("03", status="running")])
    write_results(tmp_path, results)
    earlier = previous_results(tmp_path)
    assert set(earlier) == {"01", "02"}  # finished, by fingerprint; the running one is not
    assert reusable(earlier["02"], prune=True, adaptive=True)
    assert not reusable(earlier["02"], prune=True, adaptive=False)
    assert reusable(earlier["01"], prune=True, adaptive=False)


# The report ------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_the_report_groups_points_by_answer_and_shows_each_law_and_prediction(tmp_path):
    from planner.report import write_report
    from planner.sweep.results import KneePrediction, SpeedClassInfo, write_results
    from tests.fakes.results import sweep_fixture

    results = sweep_fixture()
    ok = [p for p in results.points if p.status == "ok"]
    first, rest = ok[0], results.points[1:]
    first.answer_source, first.speed_class, first.duration_s = "searched", "c1", 500.0
    law = fit_law(first, results.settings.slo.bounds(), "c1", max_num_seqs=None)
    results.strategy = "adaptive"
    results.speed_classes = [SpeedClassInfo(id="c1", label="every point", point_ids=[p.id for p in results.points], law=law)]
    settled = rest[0]
    settled.status = settled.answer_source = "predicted"
    settled.speed_class, settled.steps, settled.failure, settled.duration_s = "c1", [], None, 0.0
    settled.knee_prediction = KneePrediction(concurrency=3, interval=[3, 4], limit="latency", speed_class="c1", law_from=first.id)
    settled.answer_note = f"predicted by class c1's law (from {first.id}), not started"
    if results.best is not None:
        results.best.others[settled.id] = settled.answer_note
    write_results(tmp_path, results)
    write_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## How the points were answered"):]
    section = section[: section.find("\n## ", 1)]
    assert f"| searched | 1 | `{first.id}` |" in section
    assert f"| predicted | 1 | `{settled.id}` |" in section
    assert f"### Class c1 (every point): law from `{first.id}`" in section
    assert f"| `{settled.id}` | c1 | 3 | [3, 4] | latency | no | - |" in section
    spent = sum(p.duration_s or 0 for p in results.points)
    assert f"Time spent on points: {spent:.0f} s. Searching the points it settled or verified would have cost about 500 s more" in section
    # A point settled unsearched is no failure.
    failures = text[text.index("## Failures"):] if "## Failures" in text else ""
    failures = failures[: failures.find("\n## ", 1)]
    assert f"| `{settled.id}` |" not in failures
    assert "How points were answered" in (tmp_path / "report.html").read_text()
    plot = tmp_path / "law-c1.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "law-c1.png" in (tmp_path / "report.html").read_text()


# The whole strategy on made-up points -----------------------------------------------------------

class LawExecutor:
    """An executor whose points follow a known law, run as the point runner would run them: the
    ceiling read at start-up (settled_by_bound), then a search, or the verification of a prediction,
    that finds the true knee (its steps: a pass at it, twice, and a failure just above)."""

    def __init__(self, truth: dict[str, tuple[int, int, int]], headroom: float) -> None:
        # point id -> (latency knee, KV ceiling, max_num_seqs)
        self.truth = truth
        self.headroom = headroom
        self.launched: list[str] = []

    async def run(self, ctx, todo) -> None:
        from planner.sweep.outcome import conclude

        for point, r in todo:
            self.launched.append(point.id)
            knee, ceiling, seqs = self.truth[point.id]
            r.search_upper_bound = ceiling
            if settled_by_bound(r, ceiling, gpus=point.gpus, headroom=self.headroom):
                continue
            m = min(knee, ceiling, seqs)
            r.steps = [step(m, "pass", 90), step(m, "pass", 90)]
            # As the search leaves it: the lowest failure within a precision step (5%) of the pass.
            above = min(ceiling, m + max(1, math.ceil(0.05 * m)))
            if m < ceiling:
                broke = "ttft_p99_ms" if above > seqs else "tpot_p50_ms"
                r.steps.append(step(above, "fail", 110 if broke == "tpot_p50_ms" else 90, (broke,)))
            prediction = r.knee_prediction
            if prediction is not None:
                prediction.verified = prediction.concurrency == m
            r.answer_source = "verified" if prediction is not None and prediction.verified else "searched"
            conclude(r, m, above if m < ceiling else None, upper=ceiling, limit=None, gpus=point.gpus,
                     headroom=self.headroom, gpu_totals_mib={})


@pytest.mark.parametrize("seed", range(8))
def test_on_random_grids_adaptive_recommends_the_laws_best_and_never_searches_a_dominated_point(tmp_path, seed):
    from planner.sweep.adaptive import run_adaptive
    from planner.sweep.executor import SweepContext
    from planner.sweep.point import PointContext

    rng = random.Random(seed)
    tokens = [512, 1024, 2048, 4096][: rng.randint(2, 4)]
    pools = ["64M", "8M", "2M", "512K"][: rng.randint(2, 4)]
    seqs = rng.sample([512, 256, 32, 8], rng.randint(1, 3))
    # The law's max_num_seqs is an exact cap: no request may wait for a slot (max_waiting = 0).
    s = settings({"max_waiting": 0}, grid={"tensor_parallel_size": rng.choice([[1], [1, 2]]),
                 "extra": {"max_num_batched_tokens": tokens, "kv_cache_memory_bytes": pools, "max_num_seqs": seqs}})
    points = expand(s)
    knees = {t: rng.randint(2, 300) for t in tokens}
    ceilings = {p: rng.randint(1, 400) for p in pools}
    # Knees up to 300: a search's bracket is then several requests wide, and a class's other points
    # can beat its first one's safe concurrency only within it, which a verification settles.
    truth = {}
    for p in points:
        c = p.config
        truth[p.id] = (knees[c["max_num_batched_tokens"]] * p.gpus, ceilings[c["kv_cache_memory_bytes"]] * p.gpus, c["max_num_seqs"])
    classes = class_of(points, s.sweep.memory_only_flags)
    corpus = SimpleNamespace(requests=[SimpleNamespace(prompt="x" * 40, messages=None, max_tokens=10)])
    results = SweepResults(started_at="t", settings={}, strategy="adaptive", points=[result(p.id, gpus=p.gpus) for p in points])
    ctx = SweepContext(shared=PointContext(settings=s, corpus=corpus, output_dir=tmp_path), results=results)
    executor = LawExecutor(truth, headroom=0.2)
    asyncio.run(run_adaptive(executor, ctx, list(zip(points, results.points)), grid=points, classes=classes, corpus=corpus, slots=1))
    finish(results)

    def true_safe(pid: str, gpus: int) -> float:
        return safe_per_gpu(min(truth[pid]), 0.2, gpus) or 0.0

    law_best = max(true_safe(p.id, p.gpus) for p in points)
    best = best_confirmed(results.points, confirm=True)
    assert best is not None and best.safe_concurrency_per_gpu == law_best
    assert all(r.status in ("ok", "dominated", "predicted") for r in results.points)
    for r in results.points:
        if r.status == "dominated":
            # Exact: its ceiling could never beat the point that dominates it.
            assert true_safe(r.id, r.gpus) <= r.dominance.by_safe_concurrency_per_gpu
        if r.status == "predicted":
            assert true_safe(r.id, r.gpus) <= law_best
    # A class whose first search found its latency knee (a latency failure, every request running)
    # is never searched again: its other points are predicted, verified or dominated. One whose
    # first search stopped at a cap of its own says nothing above it, and searches again.
    order = {pid: i for i, pid in enumerate(executor.launched)}
    for cls in {c.id for c in classes.values()}:
        searched = sorted((r for r in results.points if r.answer_source == "searched" and classes[r.id].id == cls),
                          key=lambda r: order[r.id])
        if searched and searched[0].binding_constraint == "tpot_p50_ms":
            assert len(searched) == 1, [r.id for r in searched]
    assert results.adaptive.searched + results.adaptive.verified < len(points)
