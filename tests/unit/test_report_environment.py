"""What the report says of disturbed steps, undecided rules and exceedance tests."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from planner.report import markdown, summary_csv
from planner.report.view import from_replay
from planner.tables import replay_summary
from replay.results import CpuEnvironment, LatencySummary, ProcessUse, ReplayResults, SloExceedance, StepEnvironment
from replay.search import binding
from replay.search.verdicts import knee
from tests.unit.test_report import _replay

DISTURBANCE = "other processes used 47% of the server's CPUs (more than 10%): stress (pid 4242, 4.7 s)"


def results_with_a_disturbed_step() -> ReplayResults:
    """The fixture replay; its lowest failing step closed by the KV gauge with TPOT undecided,
    its highest pass read on an interval open above, and a disturbed pass far above the knee."""
    results = _replay()
    fail_at = results.min_failing_concurrency
    steps = []
    for s in results.steps:
        if s.load.mode == "concurrency" and int(s.load.value) == fail_at and not s.slo_pass:
            s = s.model_copy(update={
                "slo_verdict": "fail",
                "slo_verdicts": {"kv_cache_usage_max": "fail", "tpot_p90_ms": "inconclusive"},
                "requests_ok": 13, "requests_failed": 0,
            })
        steps.append(s)
    passing = next(s for s in steps if s.slo_pass)
    open_above = passing.model_copy(update={
        "tpot_ms": LatencySummary(p90=24.7, ci95={"p90": [20.1, None]}),
        "slo_exceedance": {"tpot_p90_ms": SloExceedance(exceeded=1, n=30, allowed=2, effective_n=30)},
    })
    steps[steps.index(passing)] = open_above
    disturbed = passing.model_copy(update={
        "load": passing.load.model_copy(update={"value": 4 * fail_at}),
        "disturbed": [DISTURBANCE],
        "environment": StepEnvironment(
            cpu=CpuEnvironment(load_avg_1m=2.5, other_share_server_cpus=0.47, steal_share=0.0,
                               busiest=[ProcessUse(pid=4242, name="stress", cpu_s=4.7, on=["server"])]),
            unreadable=["no GPUs: GPU memory not sampled"],
        ),
    })
    steps.append(disturbed)
    bound = binding.binding(steps, fail_at, None)
    return results.model_copy(update={
        "steps": steps, "binding_constraint": bound.constraint, "binding_undecided": bound.undecided,
        "slo": {**results.slo, "tpot_p90_ms": 30.0},
    })


def test_the_report_names_the_disturbed_step_the_undecided_rule_and_the_test_that_passed():
    results = results_with_a_disturbed_step()
    data = from_replay(Path("replay.json"), results)
    text = markdown.render(data, None, [])
    fail_at = results.min_failing_concurrency
    assert "- Binding constraint: `kv_cache_usage_max`, first violated at concurrency" in text
    assert "tpot_p90_ms: undecided after 13 requests" in text
    assert "tpot_p90_ms" not in text.split("- Binding constraint: ")[1].split("\n")[0]
    assert f"- Disturbed at {4 * fail_at} (measured again, never used): {DISTURBANCE}" in text
    assert "## Environment" in text and "stress (4242, 4.7 s)" in text and "47%" in text
    assert "- no GPUs: GPU memory not sampled" in text
    assert "tpot p90 24.7 [20.1, ?] (passed: 1 of 30 above the bound (at most 2 allowed))" in text
    assert f"disturbed (not used; {DISTURBANCE})" in text

    rows = list(csv.DictReader(io.StringIO(summary_csv.render(data))))
    assert {r["binding_constraint"] for r in rows} == {"kv_cache_usage_max"}
    assert {r["binding_undecided"] for r in rows} == {"tpot_p90_ms: undecided after 13 requests"}
    flagged = [r for r in rows if r["disturbed"]]
    assert len(flagged) == 1 and flagged[0]["other_share_server_cpus"] == "0.47" and flagged[0]["busiest_other"] == "stress (4242)"

    lines = replay_summary(results.model_copy(update={"find_max": True}))
    assert any("bound by: kv_cache_usage_max (undecided there: tpot_p90_ms: undecided after 13 requests)" in x for x in lines)
    assert any(x.startswith(f"disturbed at {4 * fail_at} (measured again, never used)") for x in lines)


def test_a_disturbed_pass_is_not_the_knee():
    results = results_with_a_disturbed_step()
    _, interval = knee(results.steps)
    assert interval[0] is not None and interval[0] < results.min_failing_concurrency


def test_the_report_says_which_steps_decided_a_rule_one_step_left_undecided():
    from replay.results import SloPooled

    results = _replay()
    steps = list(results.steps)
    at = next(i for i, s in enumerate(steps) if s.slo_pass)
    steps[at] = steps[at].model_copy(update={
        "tpot_ms": LatencySummary(p90=24.1, ci95={"p90": [18.0, 33.5]}),
        "slo_pooled": {"tpot_p90_ms": SloPooled(verdict="pass", loads=[40.0, 44.0, 46.0], figure=24.6, ci95=[23.9, 25.3])},
    })
    data = from_replay(Path("replay.json"), results.model_copy(update={"steps": steps, "slo": {**results.slo, "tpot_p90_ms": 30.0}}))
    text = markdown.render(data, None, [])
    assert "tpot p90 24.1 [18, 33.5] (pass on the steps at 40, 44, 46: 24.6 [23.9, 25.3])" in text
