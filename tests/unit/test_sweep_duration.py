"""What `planner sweep --dry-run` says of each point's duration."""

from types import SimpleNamespace

import pytest

from planner.sweep.duration import duration_key, expected_text, mean_request_tokens
from planner.sweep.grid import Point
from replay.search.eta import step_wall_s


def point(**config) -> Point:
    return Point(index=1, id="01", config=config, flags=[], env={})


def test_a_previous_runs_measured_duration_wins():
    p = point(max_model_len=4096)
    text = expected_text(
        p, earlier={duration_key(p.config): 754.0}, request_duration_s=None, prediction=None,
        mean_request_tokens=None, min_requests=100, confirm=True,
    )
    assert text.startswith("expected 12 min 34 s") and "previous run" in text


def test_without_a_source_the_duration_is_unknown():
    text = expected_text(
        point(max_model_len=4096), earlier={}, request_duration_s=None, prediction=None,
        mean_request_tokens=None, min_requests=100, confirm=True,
    )
    assert "unknown" in text and "--request-duration-s" in text


def test_step_wall_time_and_rough_token_counts():
    assert step_wall_s(10, 2.0, 100) == pytest.approx(3 * 2.0 + 100 * 2.0 / 10)
    requests = [SimpleNamespace(prompt="x" * 40, messages=None, max_tokens=20),
                SimpleNamespace(prompt=None, messages=[{"content": "y" * 80}], max_tokens=None)]
    assert mean_request_tokens(requests, 16) == pytest.approx(((10 + 20) + (20 + 16)) / 2)


def test_the_dry_runs_total_costs_the_adaptive_plan_between_its_law_holding_and_every_fallback():
    from planner.sweep.duration import Expected, total_lines

    # Two classes of two points each: 600 s a full search of 6 steps (100 s a step).
    expected_by_point = {pid: Expected("x", 600.0, 6) for pid in ("a1", "a2", "b1", "b2")}
    expected_by_point["c1"] = Expected("unknown")
    classes = {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "c1": "C"}
    first = {"A": "a1", "B": "b1", "C": "c1"}
    (exhaustive,) = total_lines(expected_by_point, classes, first, "exhaustive")
    assert exhaustive == "expected total: ~40 min 00 s of search, every point searched in full; 1 point of unknown duration left out"
    (adaptive,) = total_lines(expected_by_point, classes, first, "adaptive")
    # a1 and b1 in full (1,200 s), a2 and b2 verified in 2 steps each (400 s): 1,600 s.
    assert adaptive.startswith("expected total: adaptive ~26 min 40 s of search when each class's law holds")
    assert "up to ~40 min 00 s if every verification falls back" in adaptive
    assert total_lines({"a1": Expected("unknown")}, {"a1": "A"}, {"A": "a1"}, "adaptive") == [
        "expected total: unknown (no point's duration is known; give --request-duration-s)"
    ]
