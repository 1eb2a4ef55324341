"""planner report from the fixture results: every file is produced and its numbers match the fixture."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from matplotlib.image import imread

from planner.errors import ReportError
from planner.report import write_report
from planner.report.load import load_results
from planner.sweep.results import SweepResults
from replay.results import ReplayResults
from tests.fakes.results import sweep_fixture

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _copy(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(FIXTURES / name, out)
    return out


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """The fixture sweep rendered once (plots take seconds), with a fleet target."""
    out = _copy(tmp_path_factory.mktemp("report"), "sweep")
    return out, write_report(out, target_concurrency=200)


def _replay() -> ReplayResults:
    return ReplayResults.model_validate_json((FIXTURES / "replay" / "replay.json").read_text())


def _reported(tmp_path: Path, replay: ReplayResults) -> Path:
    """`replay` written as replay.json into tmp_path/r and its report rendered there."""
    out = tmp_path / "r"
    out.mkdir(exist_ok=True)
    (out / "replay.json").write_text(replay.model_dump_json())
    write_report(out)
    return out


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _row(text: str, point_id: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| `{point_id}`"))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.parametrize(("name", "model"), [("sweep/sweep.json", SweepResults), ("replay/replay.json", ReplayResults)])
def test_fixtures_match_the_results_schemas_exactly(name: str, model: type) -> None:
    raw = json.loads((FIXTURES / name).read_text())
    expected = raw
    if model is SweepResults and raw["schema_version"] == 1:
        # The fixture is a version 1 file: its run metadata loads from `settings` into `run`.
        run = {k: raw["settings"][k] for k in ("corpus", "vllm_version", "gpus_found")}
        settings = {k: v for k, v in raw["settings"].items() if k not in run}
        expected = {**raw, "settings": settings, "run": run}
    # The fixtures predate `identity` (sweep version 3, replay version 2): they load at the
    # current version, their identity unknown.
    expected = {**expected, "schema_version": model.model_fields["schema_version"].default}
    # They predate [replay] request_order and ramp_s too: their requests went in the file's order,
    # their closed loops started at once, and they say so.
    older = {"request_order": "file", "ramp_s": 0.0}
    if model is ReplayResults:
        expected = {**expected, "settings": {**older, **expected["settings"]}}
    elif "replay" in expected["settings"]:
        expected = {**expected, "settings": {**expected["settings"], "replay": {**older, **expected["settings"]["replay"]}}}
    # The models ignore unknown keys, so a misspelled fixture key would vanish in the round trip.
    # Fields added since a fixture was recorded take their defaults and are left out (exclude_unset):
    # older results must keep loading.
    assert model.model_validate(raw).model_dump(mode="json", exclude_unset=True) == expected


def _check_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300, (path, image.shape)
    # A blank canvas would be one colour.
    assert image.std() > 0.01, path


@pytest.mark.timeout(60)
def test_sweep_report_writes_every_file(sweep_report: tuple[Path, list[Path]]) -> None:
    out, paths = sweep_report
    sweep = sweep_fixture()
    names = {p.name for p in paths}
    measured = [p for p in sweep.points if p.steps]
    expected = {"report.md", "report.html", "summary.csv", "throughput.png", "kv-cache.png", "safe-concurrency-heatmap.png", "kv-tokens.png"}
    expected |= {f"latency-{p.id}.png" for p in measured}
    # The knee read from every step, for each point with closed-loop steps.
    expected |= {f"pass-{p.id}.png" for p in measured if any(s.load.mode == "concurrency" for s in p.steps)}
    assert names == expected
    for path in paths:
        assert path.is_file() and path.parent == out
        if path.suffix == ".png":
            _check_png(path)
    report = (out / "report.md").read_text()
    for path in paths:
        if path.suffix == ".png":
            assert f"]({path.name})" in report


def test_recommendation_comes_first_with_the_fixture_numbers(sweep_report: tuple[Path, list[Path]]) -> None:
    out, _ = sweep_report
    sweep = sweep_fixture()
    report = (out / "report.md").read_text()
    best = next(p for p in sweep.points if p.id == sweep.best.point_id)
    assert report.index("## Recommendation") < report.index("## Every point")
    rec = _section(report, "Recommendation")
    assert f"point `{best.id}`" in rec
    assert ", ".join(f"{k}={v}" for k, v in best.config.items()) in rec
    assert f"**{best.safe_concurrency_per_gpu:.2f}**" in rec
    assert f"({best.safe_concurrency} concurrent requests per server on {best.gpus} GPUs)" in rec
    assert f"**{best.output_tokens_per_s_per_gpu:,.1f} output tokens/s**" in rec
    assert f"`{best.binding_constraint}`, first violated at concurrency {best.min_failing_concurrency}" in rec
    # The fixture predates the fit over every step (no answer_basis): its answer was read at max passing.
    assert best.answer_basis is None
    assert f"Answer read at: {best.max_passing_concurrency}, the highest pass below the lowest failure" in rec
    headroom = 1 - best.safe_concurrency / best.max_passing_concurrency
    assert f"{headroom * 100:.1f}% below that load" in rec
    assert f"({best.max_passing_concurrency}; {best.safe_concurrency} recommended; configured headroom 10%" in rec
    assert " ".join(best.command) in rec


def test_points_table_has_every_point(sweep_report: tuple[Path, list[Path]]) -> None:
    out, _ = sweep_report
    sweep = sweep_fixture()
    table = _section((out / "report.md").read_text(), "Every point")
    header = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    for p in sweep.points:
        row = dict(zip(header, _row(table, p.id)))
        assert row["max_model_len"] == str(p.config["max_model_len"])
        assert row["tensor_parallel_size"] == str(p.config["tensor_parallel_size"])
        if p.status == "ok":
            assert row["KV tokens"] == f"{p.capacity.kv_cache_tokens:,}"
            assert row["max passing"] == str(p.max_passing_concurrency)
            assert row["safe"] == str(p.safe_concurrency)
            assert float(row["safe per GPU"]) == pytest.approx(p.safe_concurrency_per_gpu)
            assert float(row["output tok/s per GPU"]) == pytest.approx(p.output_tokens_per_s_per_gpu)
            assert row["binding constraint"] == p.binding_constraint
        else:
            assert row["status"] == f"{p.status} ({p.failure.kind})"


def test_failures_carry_kind_and_the_largest_max_model_len_that_fits(sweep_report: tuple[Path, list[Path]]) -> None:
    out, _ = sweep_report
    failed = next(p for p in sweep_fixture().points if p.failure is not None)
    assert failed.failure.kind == "kv_too_small"
    row = _row(_section((out / "report.md").read_text(), "Failures"), failed.id)
    assert row[1] == "kv_too_small"
    estimate = failed.failure.estimated_max_model_len
    assert f"the largest max-model-len that fits is {estimate}" in row[3]
    assert f"--max-model-len {estimate}" in row[3]


def test_measured_versus_estimated(sweep_report: tuple[Path, list[Path]]) -> None:
    out, _ = sweep_report
    section = _section((out / "report.md").read_text(), "Measured versus vLLM's start-up estimate")
    for p in sweep_fixture().points:
        if p.status != "ok":
            continue
        row = _row(section, p.id)
        assert row[1] == f"{p.capacity.kv_cache_tokens:,}"
        assert row[2] == f"{p.kv_cache_tokens_predicted:,}"
        assert row[3] == f"{p.kv_cache_tokens_relative_error * 100:+.1f}%"
        assert row[4] == f"{p.capacity.max_concurrency_reported:.2f}x at {p.capacity.max_model_len:,} tokens"
        assert row[5] == str(p.max_passing_concurrency)
        assert row[7] == f"{p.max_passing_concurrency / p.capacity.max_concurrency_reported:.2f}"


def test_summary_csv_has_one_row_per_point_and_step(sweep_report: tuple[Path, list[Path]]) -> None:
    out, _ = sweep_report
    sweep = sweep_fixture()
    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(max(1, len(p.steps)) for p in sweep.points)
    for p in sweep.points:
        mine = [r for r in rows if r["point_id"] == p.id]
        if not p.steps:
            assert len(mine) == 1 and mine[0]["failure_kind"] == p.failure.kind and mine[0]["load_value"] == ""
            continue
        by_load = sorted(p.steps, key=lambda s: (s.load.value, s.started_at))
        for row, step in zip(mine, by_load, strict=True):
            assert float(row["load_value"]) == step.load.value
            assert float(row["ttft_p99_ms"]) == step.ttft_ms.p99
            assert float(row["itl_p99_ms"]) == step.itl_ms.p99
            assert float(row["output_tokens_per_s_per_gpu"]) == pytest.approx(step.output_tokens_per_s / p.gpus)
            assert row["slo_pass"] == str(step.slo_pass)
            assert row["slo_violations"] == ";".join(step.slo_violations)


@pytest.mark.timeout(60)
def test_replay_report_has_the_per_step_plots_only(tmp_path: Path) -> None:
    out = _copy(tmp_path, "replay")
    replay = _replay()
    paths = write_report(out)
    assert {p.name for p in paths} == {
        "report.md", "report.html", "summary.csv", "latency.png", "pass.png", "throughput.png", "kv-cache.png"
    }
    for path in paths:
        if path.suffix == ".png":
            _check_png(path)
    report = (out / "report.md").read_text()
    rec = _section(report, "Recommendation")
    assert f"**{replay.max_passing_concurrency}** concurrent requests" in rec
    assert f"`{replay.binding_constraint}`, first violated at concurrency {replay.min_failing_concurrency}" in rec
    assert "## Every point" not in report
    steps = _section(report, "Steps")
    assert len([line for line in steps.splitlines() if line.startswith("| ") and line[2].isdigit()]) == len(replay.steps)
    with (out / "summary.csv").open(newline="") as f:
        assert len(list(csv.DictReader(f))) == len(replay.steps)


def test_fleet_sizing_in_the_report(sweep_report: tuple[Path, list[Path]]) -> None:
    out, _ = sweep_report
    section = _section((out / "report.md").read_text(), "Fleet sizing")
    assert "Target: 200 concurrent requests." in section
    feasible = [p for p in sweep_fixture().points if p.status == "ok"]
    for p in feasible:
        row = _row(section, p.id)
        replicas = -(-200 // p.safe_concurrency)
        assert row[3] == str(replicas) and row[5] == str(replicas * p.gpus)
    # Fewest GPUs; on a tie, fewer (larger) replicas.
    cheapest = min(feasible, key=lambda p: ((-(-200 // p.safe_concurrency)) * p.gpus, -(-200 // p.safe_concurrency)))
    assert f"Cheapest: `{cheapest.id}`" in section


def test_sweep_json_wins_over_replay_json(tmp_path: Path) -> None:
    out = _copy(tmp_path, "sweep")
    shutil.copy(FIXTURES / "replay" / "replay.json", out / "replay.json")
    path, results = load_results(out)
    assert path.name == "sweep.json" and isinstance(results, SweepResults)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such results folder"):
        write_report(tmp_path / "absent")
    with pytest.raises(ReportError, match="holds neither sweep.json nor replay.json"):
        write_report(tmp_path)


def test_broken_json_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "sweep.json").write_text('{\n  "started_at": "x",\n  oops\n}\n')
    with pytest.raises(ReportError, match=r"sweep\.json:3: not valid JSON"):
        write_report(tmp_path)


def test_schema_mismatch_names_the_field(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "sweep" / "sweep.json").read_text())
    raw["points"][0]["status"] = "exploded"
    (tmp_path / "sweep.json").write_text(json.dumps(raw))
    with pytest.raises(ReportError, match=r"field points\.0\.status"):
        write_report(tmp_path)


@pytest.mark.timeout(60)
def test_a_grid_without_memory_axes_has_no_heatmap_and_no_empty_columns(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "sweep" / "sweep.json").read_text())
    tp2 = [p for p in raw["points"] if p["config"]["tensor_parallel_size"] == 2 and p["config"]["gpu_memory_utilization"] == 0.85]
    for p in tp2:
        p["config"] = {"max_model_len": p["config"]["max_model_len"], "enable_chunked_prefill": True}
    raw["points"] = tp2
    raw["best"]["point_id"] = tp2[0]["id"]
    (tmp_path / "sweep.json").write_text(json.dumps(raw))
    names = {p.name for p in write_report(tmp_path)}
    assert "safe-concurrency-heatmap.png" not in names and "kv-tokens.png" in names
    header = _section((tmp_path / "report.md").read_text(), "Every point").splitlines()[2]
    assert "| max_model_len | enable_chunked_prefill | status |" in header
    assert "gpu_memory_utilization" not in header


@pytest.mark.timeout(60)
def test_intervals_verdicts_and_the_knee_in_the_report(tmp_path: Path) -> None:
    replay = _replay()
    for s in replay.steps:
        s.slo_verdict = "pass" if s.slo_pass else "fail"
        s.ttft_ms.ci95 = {"p99": [s.ttft_ms.p99 * 0.9, None if s.load.value >= 20 else s.ttft_ms.p99 * 1.1]}
        s.requests_per_s_ci95 = [s.requests_per_s - 0.5, s.requests_per_s + 0.5]
    at_22 = next(s for s in replay.steps if s.load.value == 22)
    at_22.slo_verdict = "inconclusive"
    at_22.slo_violations = ["ttft_p99_ms"]
    replay.confirmed, replay.knee_interval = True, [20, 24]
    out = _reported(tmp_path, replay)
    report = (out / "report.md").read_text()
    rec = _section(report, "Recommendation")
    assert "- Knee: between 20 (highest conclusive pass) and 24 (lowest conclusive fail)" in rec
    assert "**confirmed** by a repeat on fresh prompts" in rec
    assert "- Inconclusive steps (counted as failures, never as passes): 22" in rec
    steps = _section(report, "Steps")
    first = replay.steps[0]
    assert f"ttft p99 {first.ttft_ms.p99:,.1f} [{first.ttft_ms.p99 * 0.9:,.1f}, {first.ttft_ms.p99 * 1.1:,.1f}]" in steps
    assert "inconclusive (counts as fail): ttft_p99_ms" in steps
    # An open side shows as `?`.
    assert ", ?]" in steps
    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["confirmed"] for r in rows} == {"True"} and {r["knee_fail"] for r in rows} == {"24"}


def test_a_lowest_fail_that_also_passed_is_said_so_and_the_band_is_shown(tmp_path: Path) -> None:
    replay = _replay()
    for s in replay.steps:
        s.slo_verdict = "pass" if s.slo_pass else "fail"
    at_24 = next(s for s in replay.steps if s.load.value == 24)
    lucky = at_24.model_copy(deep=True)
    lucky.slo_pass, lucky.slo_verdict = True, "pass"
    replay.steps.append(lucky)
    replay.confirmed, replay.knee_interval = True, [20, 24]
    out = _reported(tmp_path, replay)
    rec = _section((out / "report.md").read_text(), "Recommendation")
    assert "24 (lowest conclusive fail, though it also passed 1 of 2)" in rec
    assert "- From every step: knee " in rec and "24 passed 1 of 2" in rec and "passed and failed at 24" in rec
    with (out / "summary.csv").open(newline="") as f:
        row = next(csv.DictReader(f))
    assert (row["knee_fit"], row["knee_band_hi"], row["contested_concurrency"]) == ("20", "24", "24")


def test_a_knee_capped_by_a_single_preemption_is_said_so(tmp_path: Path) -> None:
    replay = _replay()
    for s in replay.steps:
        s.slo_verdict = "pass" if s.slo_pass else "fail"
    # 21, the lowest load above the answer (20) that did not pass, broke only max_preemptions = 0,
    # on one preemption in 127 requests: the knee may rest on it, and the report says so.
    at_21 = next(s for s in replay.steps if s.load.value == 21)
    at_21.slo_violations, at_21.slo_verdicts, at_21.server.preemptions = ["max_preemptions"], {"max_preemptions": "fail"}, 1.0
    out = _reported(tmp_path, replay)
    rec = _section((out / "report.md").read_text(), "Recommendation")
    assert "- max_preemptions = 0 capped the knee at 20: 21 broke it; from 21 up, 1 preemption in 498 requests over 4 steps:" in rec
    assert "probability 0.82 (95%: 0.33-0.99), against the 0.9 the answer is read at" in rec
    at_21.slo_violations, at_21.slo_verdicts = ["itl_p99_ms"], {"itl_p99_ms": "fail"}
    assert "capped the knee" not in (_reported(tmp_path, replay) / "report.md").read_text()


def test_a_bracket_ending_at_an_inconclusive_step_is_not_called_violated(tmp_path: Path) -> None:
    replay = _replay()
    for s in replay.steps:
        s.slo_verdict = "pass" if s.slo_pass else "fail"
    # The lowest step that did not pass (21) was only inconclusive: nothing was shown to break there.
    at_21 = next(s for s in replay.steps if s.load.value == 21)
    at_21.slo_verdict = "inconclusive"
    replay.binding_constraint, replay.binding_undecided = None, ["itl_p99_ms"]
    out = _reported(tmp_path, replay)
    rec = _section((out / "report.md").read_text(), "Recommendation")
    assert "first violated" not in rec
    assert "lowest step that did not pass: concurrency 21 (inconclusive, nothing violated conclusively)" in rec
