import random

import pytest

from replay.search.policy import (
    Bracket,
    Probe,
    bracket,
    is_confirmed,
    knee_interval,
    next_probe,
    predicted_knee,
    unresolved,
)
from replay.stats.isotonic import isotonic


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


# --- the modelled search: start high, narrow down on the SLO ratios ------------------------------


def run_law(ratio_at, *, upper, start=None, confirm=True, noise=None, limit=40):
    """Drive the search against a law `ratio_at(c)` (measured / bound of one SLO; pass at <= 1).
    `noise(c, k)` may multiply the k-th measurement at c."""
    history, seen = [], {}
    while (n := next_probe(history, start=start or upper, upper=upper, confirm=confirm)) is not None:
        k = seen.get(n, 0)
        seen[n] = k + 1
        ratio = ratio_at(n) * (noise(n, k) if noise else 1.0)
        history.append(Probe(n, "pass" if ratio <= 1 else "fail", {"tpot_p99_ms": ratio}))
        assert len(history) < limit, history
    return [p.concurrency for p in history], bracket(history)


def linear(base_ms, per_running_ms, bound_ms):
    return lambda c: (base_ms + per_running_ms * c) / bound_ms


@pytest.mark.parametrize("upper", [64, 128, 256, 1024])
def test_a_smooth_law_needs_about_four_steps_plus_the_confirmation(upper):
    # The law: ITL = 2 ms + 0.02 ms x running, TPOT bound 3 ms: the knee is 50.
    probes, b = run_law(linear(2.0, 0.02, 3.0), upper=upper)
    assert probes[0] == upper
    assert b.max_passing <= 50 and b.max_passing >= 48 and b.min_failing > 50
    assert len(probes) <= 7, probes
    # Nothing at or below a quarter of the knee is ever measured: low concurrencies only when a
    # higher one failed, and the model skips past them.
    assert min(probes) > 12


def test_the_search_starts_at_the_bound_and_ends_there_when_it_passes():
    probes, b = run_law(lambda c: 0.5, upper=59)
    assert probes == [59, 59] and (b.max_passing, b.min_failing) == (59, None)


def test_a_server_that_fails_at_one_answers_none_quickly():
    probes, b = run_law(lambda c: 2.0 + c / 100, upper=128)
    assert (b.max_passing, b.min_failing) == (None, 1)
    assert len(probes) <= 9 and probes[-1] == 1


def test_a_cliff_still_converges_to_the_right_answer():
    # Latency is flat, then jumps (a KV pool that starts preempting): the model undershoots, and
    # bisection takes over after two model probes on the same side.
    probes, b = run_law(lambda c: 0.8 if c <= 40 else 3.0, upper=256)
    assert (b.max_passing, b.min_failing) == (40, 41)
    assert len(probes) <= 14, probes


def test_a_rule_without_a_ratio_falls_back_to_bisection():
    # Preemptions (a count) break at 30: no ratio to model, so the search bisects.
    history = []
    while (n := next_probe(history, start=100, upper=100)) is not None:
        history.append(Probe(n, "pass" if n <= 30 else "fail"))
    assert [p.concurrency for p in history][:3] == [100, 50, 25]
    assert bracket(history) == Bracket(30, 31) or bracket(history).min_failing - bracket(history).max_passing <= 2


def test_noise_near_the_knee_never_lifts_the_answer_above_a_failure():
    rng = random.Random(3)
    probes, b = run_law(linear(2.0, 0.02, 3.0), upper=256, noise=lambda c, k: rng.uniform(0.97, 1.03))
    assert b.max_passing is not None and b.max_passing <= 51


def test_isotonic_pools_violations():
    assert isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([5.0, 1.0], [1, 3]) == [2.0, 2.0]


def test_predicted_knee_interpolates_between_the_fitted_points_around_one():
    history = [Probe(100, "fail", {"a": 1.5}), Probe(50, "pass", {"a": 0.5})]
    assert predicted_knee(history) == pytest.approx(75.0)
    # The lowest crossing of any rule sets the knee.
    history = [Probe(100, "fail", {"a": 1.5, "b": 3.0}), Probe(50, "pass", {"a": 0.5, "b": 0.5})]
    assert predicted_knee(history) == pytest.approx(60.0)
    # From one failing point: a ratio proportional to concurrency.
    assert predicted_knee([Probe(90, "fail", {"a": 1.5})]) == pytest.approx(60.0)


# --- unresolved steps: no information, never the reason for "none" -------------------------------


def test_an_unresolved_step_is_measured_again_then_higher():
    history = [Probe(8, "unresolved")]
    assert next_probe(history, start=8, upper=64) == 8
    history.append(Probe(8, "unresolved"))
    assert next_probe(history, start=8, upper=64) == 12
    assert unresolved(history) == [8]


def test_unresolved_steps_never_make_the_answer_none():
    # Everything below the failure at 64 ran out of time: the answer is unresolved, not "none
    # (lowest failing: 1)", and the search does not walk down to 1 on them.
    history = [Probe(64, "fail", {"a": 1.2})]
    while (n := next_probe(history, start=64, upper=64, confirm=True)) is not None:
        history.append(Probe(n, "unresolved"))
        assert len(history) < 20
    b = bracket(history)
    assert b.max_passing is None and b.min_failing == 64
    assert unresolved(history) and all(c < 64 for c in unresolved(history))
    assert 1 not in [p.concurrency for p in history]


def test_an_unresolved_step_does_not_move_the_bracket_or_the_knee_interval():
    history = [Probe(64, "fail"), Probe(32, "pass"), Probe(48, "unresolved")]
    assert bracket(history) == Bracket(32, 64)
    assert knee_interval([(64, "fail"), (32, "pass"), (48, "unresolved")]) == [32, 64]


def test_a_knee_just_under_a_failed_step_is_approached_by_a_step_down_not_a_halving():
    # A shared machine's CI run: 24 failed, the model's 20 failed by a hair, and 19 came out
    # inconclusive. The model puts the knee at 19, already tried, and nothing has passed: the next
    # probe steps down 10% (two conclusive failures; the inconclusive 19 read close to its bound),
    # not to 9.
    history = [
        Probe(24, "fail", {"tpot_p90_ms": 1.19}),
        Probe(20, "fail", {"tpot_p90_ms": 1.006}),
        Probe(19, "inconclusive", {"tpot_p90_ms": 0.99}),
    ]
    assert next_probe(history, start=24, upper=256, confirm=True) == 17
    # A third conclusive failure doubles the step: 20% below 17.
    assert next_probe([*history, Probe(17, "fail", {"tpot_p90_ms": 1.01})], start=24, upper=256, confirm=True) == 13


def test_a_descent_through_inconclusive_steps_below_a_contested_load_does_not_halve():
    # The repeatability benchmark's search that answered 24: 66 and 50 failed, 38 passed, then
    # 41-38 did not (38's repeat failed) and 36, 34, 32 came out inconclusive. Counting every
    # failure of the search halved to 16; the three conclusive failures since 38 passed step 20%.
    # Their TPOT p90 / bound as measured.
    steps = [(66, "fail", 1.31), (50, "fail", 1.13), (38, "pass", 0.95), (41, "inconclusive", 1.02), (40, "fail", 0.98),
             (39, "fail", 1.06), (38, "fail", 1.08), (36, "inconclusive", 1.01), (34, "inconclusive", 1.02),
             (32, "inconclusive", 0.96)]  # fmt: skip
    history = [Probe(c, v, {"tpot_p90_ms": r}) for c, v, r in steps]
    assert next_probe(history, confirm=True) == 25


def test_a_flat_line_extended_below_every_step_crosses_no_deeper_than_half_the_proportional_estimate():
    # The repeatability benchmark's search that answered 18: 67, 57 and 47 failed early on short
    # steps that read TPOT p90 1.16, 1.25 and 1.16 of the bound. The line through them crosses 1
    # at 6; the probe is half the proportional estimate 47 / 1.162 instead (the fake's law puts
    # the knee at 34).
    history = [Probe(67, "fail", {"tpot_p90_ms": 1.157}), Probe(57, "fail", {"tpot_p90_ms": 1.248}),
               Probe(47, "fail", {"tpot_p90_ms": 1.162})]  # fmt: skip
    assert predicted_knee(history) == pytest.approx(47 / 1.162 / 2)
    assert next_probe(history, start=67, upper=67, confirm=True) == 20
    # A model inside the halving is still followed: from one point, the ratio proportional to load.
    assert next_probe([Probe(90, "fail", {"a": 1.5})], start=90, upper=90) == 60


@pytest.mark.parametrize("knee", [5, 17, 18, 40])
def test_steps_down_reach_any_knee_below_a_model_that_overshoots(knee):
    # The ratio law says 19.5, but the server breaks above `knee`: the search still converges to it.
    history, seen = [], {}
    while (n := next_probe(history, start=24, upper=256, confirm=True)) is not None:
        seen[n] = seen.get(n, 0) + 1
        ratio = min(n / 19.5, 1.0 if n <= knee else 1.01) if n <= knee else max(n / 19.5, 1.01)
        history.append(Probe(n, "pass" if n <= knee else "fail", {"tpot_p90_ms": ratio}))
        assert len(history) < 20, history
    b = bracket(history)
    assert b.max_passing is not None and b.max_passing <= knee < b.min_failing
    assert b.min_failing - b.max_passing <= max(1, 0.05 * b.max_passing)


def test_a_failed_confirmation_steps_one_precision_step_down_not_to_the_low_guess():
    # The run 2: 52 passed, its repeat failed; the only other pass was the start-up's 26.
    history = [Probe(59, "fail"), Probe(56, "fail"), Probe(52, "pass"), Probe(55, "fail"), Probe(53, "fail"),
               Probe(52, "fail"), Probe(26, "pass")]  # fmt: skip
    assert next_probe(history, confirm=True) == 49
    # Once 49 is tried the search narrows as before.
    assert next_probe([*history, Probe(49, "fail")], confirm=True) not in (None, 49)


def test_below_a_disagreement_the_search_steps_down_by_precision_not_halving():
    # 34 passed, then its confirmation and 33 did not; 31 was inconclusive with nothing passed
    # below it: the steps disagree from 33 up, so 29 is next, not a halving to 15.
    history = [Probe(40, "fail"), Probe(34, "pass"), Probe(34, "inconclusive"), Probe(33, "fail"), Probe(31, "inconclusive")]
    assert next_probe(history, confirm=True) == 29


def run_on_starts(knees: list[int], *, upper: int = 80) -> tuple[list[tuple[int, bool]], list[int]]:
    """Drive the search over several server starts, as the sweep does ([sweep] server_starts):
    start k passes exactly up to knees[k], and each later start goes on from the pooled steps.
    Returns the history and the index where each start began."""
    history: list[tuple[int, bool]] = []
    began = []
    for knee in knees:
        began.append(len(history))
        while (
            n := next_probe(history, start=upper, upper=upper, confirm=True, confirm_from=began[-1])
        ) is not None:
            history.append((n, n <= knee))
            assert len(history) < 60
    return history, began


def test_a_later_start_must_pass_the_answer_again_before_the_search_ends():
    # The second start is as fast as the first: one step on it, at the answer, and the search ends.
    history, began = run_on_starts([50, 50])
    assert history[began[1]:] == [(50, True)]
    assert bracket(history).max_passing == 50 and is_confirmed(history, 50, since=began[1])


def test_a_slower_later_start_moves_the_answer_to_its_own_knee():
    # The CPU demo's 32M point answered 56 on one start and 45 on another.
    history, began = run_on_starts([56, 45])
    b = bracket(history)
    assert b.max_passing == 45 and b.min_failing is not None and b.min_failing <= 48
    # The first start answered 55 (within the 5% precision of its knee). The second failed it and
    # went on below one precision step at a time, and confirmed on the second start itself.
    second = history[began[1]:]
    assert history[began[1] - 1] == (55, True)
    assert [c for c, _ in second[:4]] == [55, 52, 50, 47] and not any(ok for _, ok in second[:4])
    assert is_confirmed(history, 45, since=began[1])


def test_a_faster_later_start_keeps_the_slower_answer():
    # Nothing above the first start's lowest failure is tried again: the answer holds on both.
    history, began = run_on_starts([45, 56])
    assert bracket(history).max_passing == 45 and history[began[1]:] == [(45, True)]


def test_a_later_start_confirms_even_where_the_search_itself_does_not():
    # [replay] confirm_knee = false: one start ends at its first bracket, a later one still
    # measures the answer once on its own server.
    history = [(80, False), (50, True), (52, False)]
    assert next_probe(history, start=80, upper=80, confirm=False) is None
    assert next_probe(history, start=80, upper=80, confirm=False, confirm_from=3) == 50
