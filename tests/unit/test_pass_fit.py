"""The knee read from every step of a point (replay.search.pass_fit)."""

from __future__ import annotations

import pytest

from replay.search.pass_fit import describe, fit, fit_trials
from replay.results import LoadSpec
from tests.fakes.results import make_step

# The run 2 of the CPU demo's 32M point, in order (45 was inconclusive).
RUN_2 = [
    (59, "fail"), (56, "fail"), (52, "pass"), (55, "fail"), (53, "fail"), (52, "fail"), (26, "pass"),
    (51, "fail"), (50, "fail"), (38, "pass"), (49, "pass"), (49, "fail"), (48, "pass"), (48, "fail"),
    (43, "pass"), (45, "inconclusive"), (43, "pass"),
]  # fmt: skip


def test_contradictory_steps_are_pooled_monotone_and_shown():
    fitted = fit_trials(RUN_2, 0.9)
    prob = {p.concurrency: p.probability for p in fitted.points}
    loads = sorted(prob)
    # Never rises with load.
    assert all(prob[a] >= prob[b] for a, b in zip(loads, loads[1:]))
    # 43 passed 2 of 2, and so did everything below it: pass probability 1 there.
    assert prob[26] == prob[38] == prob[43] == 1.0
    # 48, 49 and 52 passed 1 of 2 each, 45 was inconclusive: below the level.
    assert prob[48] < 0.9 and prob[52] < 0.9
    assert fitted.knee_fit == 43
    assert fitted.knee_band == [43, 52]
    assert fitted.contested == [48, 49, 52]
    counts = {p.concurrency: (p.passes, p.steps) for p in fitted.points}
    assert counts[48] == (1, 2) and counts[43] == (2, 2)
    line = describe(fitted)
    assert line.startswith("knee 43-52: 43 passed 2 of 2, 45 passed 0 of 1, 48 passed 1 of 2")
    assert "43 has pass probability >= 0.9" in line and "passed and failed at 48, 49, 52" in line


def test_run_1s_contested_51_is_not_a_clean_fail():
    # Run 1: 51 passed on 100 requests and failed on 10; the report called it the lowest fail.
    fitted = fit_trials([(59, "fail"), (56, "fail"), (53, "fail"), (50, "pass"), (51, "pass"), (51, "fail"), (50, "pass")])
    assert fitted.knee_fit == 50 and fitted.knee_band == [50, 51] and fitted.contested == [51]


def test_a_pass_above_failures_is_pooled_down_not_taken():
    fitted = fit_trials([(10, "pass"), (20, "fail"), (30, "pass")])
    prob = {p.concurrency: p.probability for p in fitted.points}
    assert prob[20] == prob[30] == 0.5 and fitted.knee_fit == 10 and fitted.knee_band == [10, 30]
    lo, hi = next(p.ci95 for p in fitted.points if p.concurrency == 30)
    assert lo < 0.5 < hi


def test_unresolved_steps_say_nothing_and_the_level_is_checked():
    steps = [make_step(load=LoadSpec(mode="concurrency", value=8), slo_verdict="unresolved", slo_pass=False),
             make_step(load=LoadSpec(mode="concurrency", value=4), slo_verdict="pass", slo_pass=True)]
    fitted = fit(steps)
    assert [p.concurrency for p in fitted.points] == [4] and fitted.knee_fit == 4
    assert fit_trials([]).knee_fit is None and describe(fit_trials([])) is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        fit_trials([(1, "pass")], 1.0)


def test_a_rule_near_its_bound_over_the_top_loads_is_named():
    from replay.results import LatencySummary

    from replay.search.pass_fit import little_margin

    def step(c: int, p90: float):
        return make_step(load=LoadSpec(mode="concurrency", value=c), slo_verdict="pass", tpot_ms=LatencySummary(p90=p90))

    # The flat TPOT: 16 ms at 32, then 27-30 ms from 45 up against 30 ms.
    steps = [step(32, 16.0), step(45, 28.0), step(48, 27.0), step(48, 30.0), step(52, 29.0)]
    assert little_margin(steps, {"tpot_p90_ms": 30.0, "error_rate": 0.0}) == [
        "tpot_p90_ms 27-30 against 30 from 45 up (3 loads): little margin"
    ]
    # Rising through the bound is a knee, not a flat metric.
    assert little_margin([step(32, 16.0), step(45, 22.0), step(52, 40.0)], {"tpot_p90_ms": 30.0}) == []


def test_the_knee_range_runs_from_the_clean_passes_to_the_first_load_above_every_pass():
    from replay.search.pass_fit import knee_range

    contested = fit_trials([(43, "pass"), (48, "pass"), (48, "fail"), (52, "pass"), (52, "fail"), (55, "fail")])
    assert contested.knee_band == [43, 52]
    assert knee_range(contested) == [43, 55]
    # Nothing measured above the last pass: open above; nothing passed cleanly: open below.
    assert knee_range(fit_trials([(8, "pass"), (16, "pass")])) == [16, None]
    assert knee_range(fit_trials([(8, "fail"), (8, "pass"), (16, "fail")])) == [None, 16]
    assert knee_range(fit_trials([])) is None
