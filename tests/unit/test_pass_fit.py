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


def test_a_knee_that_may_rest_on_single_preemptions_is_named():
    from replay.results import ServerSummary
    from replay.search.pass_fit import rare_event_margin

    def step(c: int, verdict: str, preemptions: float | None, requests: int = 100, broke: str = "tpot_p90_ms"):
        return make_step(
            load=LoadSpec(mode="concurrency", value=c), slo_verdict=verdict, slo_pass=verdict == "pass",
            requests_ok=requests, requests_failed=0, server=ServerSummary(metrics_available=True, preemptions=preemptions),
            slo_verdicts={} if verdict == "pass" else {broke: "fail"},
        )  # fmt: skip

    slo = {"tpot_p90_ms": 70.5, "max_preemptions": 0.0}
    # The repeatability benchmark's search that answered 28: 29 failed on one spurious preemption.
    steps = [step(61, "fail", 0, 12), step(46, "fail", 0, 30), step(29, "fail", 1, broke="max_preemptions"),
             step(23, "pass", 0), step(26, "pass", 0), step(27, "pass", 0), step(28, "pass", 0), step(28, "pass", 0)]  # fmt: skip
    (line,) = rare_event_margin(steps, slo, 28)
    # From 29 up: 1 preemption in 142 requests; exp(-100/142) = 0.49, and the interval's lower
    # end, exp(-100 x 5.57 / 142), is 0.02: far below the 0.9 level.
    assert line.startswith("max_preemptions = 0 capped the knee at 28: 29 broke it; from 29 up, 1 preemption in 142 requests over 3 steps:")
    assert "probability 0.49 (95%: 0.02-0.98), against the 0.9 the answer is read at" in line
    assert line.endswith("the steps cannot tell the rule from one chance preemption, and the knee may rest on one")
    # vLLM's CPU build, 32M pool: 6 preemptions in 622 requests from 53 up. The interval lies
    # wholly below the level: the rule, not chance, caps the knee.
    (full,) = rare_event_margin([step(53, "fail", 6, 622, broke="max_preemptions"), step(51, "pass", 0)], slo, 51)
    assert full.endswith("probability 0.38 (95%: 0.12-0.70), against the 0.9 the answer is read at: the preemptions there cap the knee")
    # Capped by another rule, or with no failure above the answer: nothing to say.
    tpot_capped = [step(29, "fail", 1) if s.load.value == 29 else s for s in steps]
    assert rare_event_margin(tpot_capped, slo, 28) == []
    assert rare_event_margin(steps, slo, 61) == []
    # A rate rule is not strict; no answer, no line.
    assert rare_event_margin(steps, {**slo, "max_preemptions": 2.0}, 28) == []
    assert rare_event_margin(steps, slo, None) == []
    # Many requests above the cap with one preemption leave a margin: 1 in 20,000 reads 0.995 (0.97-1.00).
    assert rare_event_margin(steps + [step(30, "fail", 0, 20_000)], slo, 28) == []
    # A counter that was not read is left out (never read as 0 preemptions, nor as a margin).
    unread = [step(29, "fail", 1, broke="max_preemptions"), step(40, "fail", None), step(28, "pass", 0)]
    assert rare_event_margin(unread, slo, 28)[0].startswith(
        "max_preemptions = 0 capped the knee at 28: 29 broke it; from 29 up, 1 preemption in 100 requests over 1 step:"
    )


def test_each_server_starts_own_bracket_is_shown_beside_the_pooled_answer():
    from replay.search.pass_fit import describe_starts

    def on(start, c, verdict):
        return make_step(load=LoadSpec(mode="concurrency", value=c), slo_pass=verdict == "pass", slo_verdict=verdict, server_start=start)

    first = [on(1, 59, "fail"), on(1, 56, "pass"), on(1, 57, "fail"), on(1, 56, "pass")]
    second = [on(2, 56, "fail"), on(2, 53, "fail"), on(2, 45, "pass"), on(2, 49, "inconclusive"), on(2, 45, "pass")]
    assert describe_starts(first) is None
    assert describe_starts(first + second) == (
        "server starts: 1 passed up to 56, failed at 57 (4 steps, knee 56); 2 passed up to 45, failed at 49"
        " (5 steps, knee 45); the answer is what held on 2 of 2: 45"
    )
    assert fit(first + second).knee_fit == 45
    # One start's steps alone, or steps written before the field: no line.
    assert describe_starts([make_step()]) is None


def test_the_answer_over_server_starts_is_what_held_on_most_of_them():
    from replay.search.pass_fit import describe_starts, majority_knee, start_knees, starts_disagree

    def on(start, c, verdict):
        return make_step(load=LoadSpec(mode="concurrency", value=c), slo_pass=verdict == "pass", slo_verdict=verdict, server_start=start)

    # The demo's run at cd9629b: start 2 ran slower (TPOT p90 49.8 ms at 51 where start 1 read
    # 21.6-26), and a third start passes at start 1's knee.
    first = [on(1, 59, "fail"), on(1, 56, "fail"), on(1, 51, "pass"), on(1, 54, "pass"), on(1, 54, "fail"),
             on(1, 52, "fail"), on(1, 51, "pass")]  # fmt: skip
    second = [on(2, 51, "fail"), on(2, 48, "inconclusive"), on(2, 45, "inconclusive"), on(2, 40, "unresolved"),
              on(2, 40, "inconclusive"), on(2, 36, "pass"), on(2, 38, "pass"), on(2, 39, "pass"), on(2, 39, "pass")]  # fmt: skip
    third = [on(3, 51, "pass")]
    assert start_knees(first) is None
    assert start_knees(first + second) == {1: 51, 2: 39}
    assert starts_disagree([51, 39], 0.05), "12 apart, where one precision step at 39 is 2"
    assert not starts_disagree([51, 50], 0.05) and not starts_disagree([40, 42], 0.05)
    assert starts_disagree([51, None], 0.05) and not starts_disagree([None, None], 0.05)
    # Two starts must both hold it; three answer with the middle knee, whichever start is slow.
    assert majority_knee([51, 39]) == 39
    assert start_knees(first + second + third) == {1: 51, 2: 39, 3: 51}
    assert majority_knee([51, 39, 51]) == 51 and majority_knee([39, 51, 45]) == 45 and majority_knee([39, 38, 51]) == 39
    # A start where nothing reached the level counts below every load; four need three.
    assert majority_knee([51, None, 50]) == 50 and majority_knee([None, None, 50]) is None
    assert majority_knee([51, 50, 39, 48]) == 48 and majority_knee([]) is None
    # The pooled fit alone would answer with the slow start's knee.
    assert fit(first + second + third).knee_fit == 39
    assert describe_starts(first + second + third) == (
        "server starts: 1 passed up to 51, failed at 52 (7 steps, knee 51); 2 passed up to 39, failed at 40"
        " (8 steps, knee 39); 3 passed up to 51, nothing above tried (1 step, knee 51); the answer is what"
        " held on 2 of 3: 51"
    )
