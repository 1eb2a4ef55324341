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
