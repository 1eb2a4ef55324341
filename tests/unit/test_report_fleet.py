"""Fleet sizing: the request rate at the safe concurrency and the replica arithmetic."""

from __future__ import annotations

import pytest

from planner.errors import ConfigError
from planner.report.fleet import plan_fleet, requests_per_s_at
from planner.report.view import PointView
from replay.results import ClientSummary, LatencySummary, LoadSpec, ServerSummary, StepResult


def step(concurrency: float, rps: float, mode: str = "concurrency") -> StepResult:
    empty = LatencySummary()
    return StepResult(
        load=LoadSpec(mode=mode, value=concurrency),
        started_at="2026-07-14T10:00:00Z",
        warmup_requests=0,
        window_s=10.0,
        requests_ok=10,
        requests_failed=0,
        ttft_ms=empty,
        itl_ms=empty,
        tpot_ms=empty,
        e2e_ms=empty,
        requests_per_s=rps,
        input_tokens_per_s=None,
        output_tokens_per_s=rps * 100,
        tokens_source="usage",
        server=ServerSummary(),
        client=ClientSummary(),
        slo_pass=True,
    )


def point(pid: str, safe: int | None, gpus: int | None, steps: list[StepResult], status: str = "ok") -> PointView:
    return PointView(
        id=pid, config={}, status=status, gpus=gpus, steps=tuple(steps), max_passing=safe,
        min_failing=None, safe=safe, binding_constraint=None,
    )


STEPS = [step(4, 2.0), step(8, 3.6), step(16, 6.0), step(16, 5.0)]


def test_rate_is_measured_when_the_safe_concurrency_was_a_step() -> None:
    est = requests_per_s_at(STEPS, 8)
    assert est.requests_per_s == 3.6 and est.method == "measured at 8"


def test_repeated_steps_are_averaged() -> None:
    assert requests_per_s_at(STEPS, 16).requests_per_s == pytest.approx(5.5)


def test_rate_is_interpolated_between_the_steps_around_it() -> None:
    est = requests_per_s_at(STEPS, 12)
    assert est.requests_per_s == pytest.approx(3.6 + (5.5 - 3.6) / 2)
    assert est.method == "interpolated between 8 and 16"


def test_below_the_lowest_step_the_rate_scales_through_the_origin() -> None:
    est = requests_per_s_at(STEPS, 2)
    assert est.requests_per_s == pytest.approx(1.0)
    assert "origin" in est.method


def test_above_the_highest_step_the_rate_is_held() -> None:
    assert requests_per_s_at(STEPS, 40).requests_per_s == pytest.approx(5.5)


def test_rate_steps_do_not_count_as_concurrency() -> None:
    assert requests_per_s_at([step(3.0, 3.0, mode="rate")], 3) is None


def test_replicas_for_a_target_rate_and_the_cheapest_by_gpus() -> None:
    points = [
        point("one-gpu", 12, 1, STEPS),  # 4.55 rps per replica -> 22 replicas, 22 GPUs
        point("two-gpu", 16, 2, STEPS),  # 5.5 rps per replica -> 19 replicas, 38 GPUs
        point("broken", None, 1, [], status="infeasible"),
    ]
    plan = plan_fleet(points, target_rps=100)
    by_id = {o.point_id: o for o in plan.options}
    assert set(by_id) == {"one-gpu", "two-gpu"}
    assert by_id["one-gpu"].replicas == 22 and by_id["one-gpu"].gpus == 22
    assert by_id["two-gpu"].replicas == 19 and by_id["two-gpu"].gpus == 38
    assert plan.cheapest.point_id == "one-gpu"


def test_both_targets_take_the_larger_requirement() -> None:
    plan = plan_fleet([point("p", 8, 1, STEPS)], target_rps=7.2, target_concurrency=40)
    # 7.2 / 3.6 = exactly 2 replicas for the rate; 40 / 8 = 5 for the concurrency.
    assert plan.options[0].replicas == 5


def test_an_exact_ratio_does_not_add_a_replica() -> None:
    plan = plan_fleet([point("p", 8, 1, STEPS)], target_rps=3.6 * 3)
    assert plan.options[0].replicas == 3


def test_unknown_gpus_still_give_replicas() -> None:
    plan = plan_fleet([point("replay", 8, None, STEPS)], target_concurrency=20)
    assert plan.options[0].replicas == 3 and plan.options[0].gpus is None


def test_a_point_without_rate_steps_cannot_be_sized_for_a_rate() -> None:
    plan = plan_fleet([point("p", 3, 1, [step(3, 3.0, mode="rate")])], target_rps=10)
    assert plan.options == () and "no concurrency step" in plan.unsized["p"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_rps": 0.0}, "--target-rps"),
        ({"target_rps": float("nan")}, "--target-rps"),
        ({"target_concurrency": 0}, "--target-concurrency"),
        ({}, "needs --target-rps or --target-concurrency"),
    ],
)
def test_bad_targets_are_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_fleet([point("p", 8, 1, STEPS)], **kwargs)
