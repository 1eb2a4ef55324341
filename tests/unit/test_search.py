import random

import pytest

from replay.search import bracket, is_confirmed, knee_interval, next_probe


def run_search(threshold: int, *, start: int = 1, upper: int | None = None, precision: float = 0.05):
    """Drive next_probe against a server whose SLOs hold up to `threshold`."""
    history = []
    while (n := next_probe(history, start=start, upper=upper, rel_precision=precision)) is not None:
        assert n not in [c for c, _ in history], "a probe was repeated"
        history.append((n, n <= threshold))
        assert len(history) < 50
    return history, bracket(history)


@pytest.mark.parametrize("threshold", [1, 2, 3, 7, 8, 9, 31, 64, 100, 1000])
def test_search_finds_threshold_to_one_request_or_five_percent(threshold):
    history, b = run_search(threshold)
    assert b.max_passing is not None and b.max_passing <= threshold
    assert b.min_failing is not None and b.min_failing > threshold
    assert b.min_failing - b.max_passing <= max(1, 0.05 * b.max_passing)


def test_small_thresholds_are_exact():
    for threshold in range(1, 21):
        _, b = run_search(threshold)
        assert (b.max_passing, b.min_failing) == (threshold, threshold + 1)


def test_doubling_then_bisection_order():
    history, _ = run_search(40)
    assert [c for c, _ in history][:7] == [1, 2, 4, 8, 16, 32, 64]
    assert history[7] == (48, False)


def test_nothing_passes():
    history, b = run_search(0)
    assert history == [(1, False)]
    assert (b.max_passing, b.min_failing) == (None, 1)


def test_upper_bound_that_passes_ends_the_search():
    history, b = run_search(1000, upper=20)
    assert [c for c, _ in history] == [1, 2, 4, 8, 16, 20]
    assert (b.max_passing, b.min_failing) == (20, None)


def test_start_at_the_upper_bound_brackets_downwards():
    history, b = run_search(5, start=24, upper=24)
    assert history[0] == (24, False)
    assert history[1] == (12, False)
    assert (b.max_passing, b.min_failing) == (5, 6)


def test_noisy_pass_above_a_failure_is_ignored():
    b = bracket([(8, True), (16, False), (24, True)])
    assert (b.max_passing, b.min_failing) == (8, 16)
    assert next_probe([(8, True), (16, False), (24, True)]) == 12


def test_precision_five_percent_at_large_values():
    history, b = run_search(700)
    assert b.min_failing - b.max_passing <= 0.05 * b.max_passing
    assert len(history) <= 16


def test_bad_arguments():
    with pytest.raises(ValueError):
        next_probe([], start=0)
    with pytest.raises(ValueError):
        next_probe([], upper=0)


def run_confirmed(verdict_at, *, start=1, upper=None, limit=60):
    """Drive the search with confirmation; `verdict_at(c, k)` gives the k-th verdict at c."""
    history, seen = [], {}
    while (n := next_probe(history, start=start, upper=upper, confirm=True)) is not None:
        k = seen.get(n, 0)
        seen[n] = k + 1
        history.append((n, verdict_at(n, k) == "pass"))
        assert len(history) < limit
    return history, bracket(history)


def test_the_highest_pass_is_measured_again_before_the_search_ends():
    history, b = run_confirmed(lambda c, k: "pass" if c <= 10 else "fail")
    assert history[-1] == (10, True) and [c for c, _ in history].count(10) == 2
    assert (b.max_passing, b.min_failing) == (10, 11)
    assert is_confirmed(history, 10)


def test_a_repeat_that_does_not_pass_steps_down_and_confirms_again():
    # 10 passed once by luck: its repeat is inconclusive, so 9 is the answer, confirmed.
    history, b = run_confirmed(lambda c, k: "pass" if c <= 9 or (c == 10 and k == 0) else "inconclusive")
    assert (b.max_passing, b.min_failing) == (9, 10)
    assert is_confirmed(history, 9)


def test_an_upper_bound_that_passes_is_confirmed_too():
    history, b = run_confirmed(lambda c, k: "pass", upper=20)
    assert [c for c, _ in history][-2:] == [20, 20] and b.max_passing == 20


@pytest.mark.parametrize("seed", range(30))
def test_never_above_a_failure_under_noisy_verdicts(seed):
    # Near the knee (12) verdicts are random; far below they pass, above they fail or are inconclusive.
    rng = random.Random(seed)

    def verdict(c, k):
        if c <= 8:
            return "pass"
        if c <= 12:
            return rng.choice(["pass", "pass", "inconclusive", "fail"])
        return rng.choice(["fail", "inconclusive"])

    history, b = run_confirmed(verdict)
    failed = [c for c, passed in history if not passed]
    assert b.max_passing is None or all(b.max_passing < c for c in failed)
    assert b.max_passing is not None and b.max_passing <= 12 and is_confirmed(history, b.max_passing)


def test_knee_interval_takes_conclusive_verdicts_only():
    assert knee_interval([(4, "pass"), (8, "pass"), (16, "fail"), (12, "inconclusive"), (10, "pass")]) == [10, 16]
    # A pass above a conclusive fail is noise.
    assert knee_interval([(4, "pass"), (6, "fail"), (8, "pass")]) == [4, 6]
    assert knee_interval([(4, "inconclusive")]) == [None, None]
    # 5 passed, then its confirmation was inconclusive: the search stepped down to 4, and the
    # interval's lower edge goes with it.
    assert knee_interval([(4, "pass"), (8, "fail"), (6, "fail"), (5, "pass"), (5, "inconclusive"), (4, "pass")]) == [4, 6]
