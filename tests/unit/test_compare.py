"""`planner compare` without a server: matching points, identity differences, the verdict rules at
their edges, old result files, and the exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.compare.core import capacity_verdict, compare, representative_steps
from planner.compare.identity import differences
from planner.compare.runs import RunPoint, load_run, match
from planner.identity import hardware, model_identity, parse_gpu_query
from planner.sweep.results import PointResult, SweepResults
from replay.identity import Hardware, Identity, ModelIdentity
from replay.identity import served_model_files
from replay.results import LatencySummary, LoadSpec, ReplayResults
from tests.fakes.results import FIXTURES, make_step

# --- identity -----------------------------------------------------------------------------------


def _identity(**over) -> Identity:
    base = dict(
        planner_version="0.1.0",
        vllm_version="0.31.1",
        model=ModelIdentity(name="meta-llama/Llama-3.1-8B-Instruct", revision="0e9e39f", dtype="bfloat16"),
        server_command=["vllm", "serve"],
        server_flags=["--max-num-seqs", "256", "--enforce-eager"],
        server_env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"},
        hardware=Hardware(kind="gpu", model="NVIDIA H100 80GB HBM3", count=8, memory_mib=81559, driver_version="550.54", cuda_version="12.4"),
        corpus_sha256="ab" * 32,
        slo={"ttft_p99_ms": 800.0},
    )
    base.update(over)
    return Identity(**base)


def test_identity_differences_read_as_one_line():
    before = _identity()
    after = _identity(vllm_version="0.32.0", server_flags=["--max-num-seqs", "512", "--enforce-eager"])
    assert ", ".join(differences(before, after)) == "vLLM 0.31.1 -> 0.32.0, --max-num-seqs 256 -> 512, corpus unchanged"


def test_identity_differences_name_every_kind_of_change():
    before = _identity()
    after = _identity(
        model=ModelIdentity(name="meta-llama/Llama-3.1-8B-Instruct", revision="1f2a3b4", dtype="bfloat16", quantization="fp8"),
        server_flags=["--max-num-seqs", "256", "--kv-cache-dtype=fp8"],
        server_env={},
        hardware=Hardware(kind="gpu", model="NVIDIA H100 80GB HBM3", count=8, memory_mib=81559, driver_version="560.35", cuda_version="12.6"),
        corpus_sha256="cd" * 32,
        slo={"ttft_p99_ms": 500.0},
    )
    assert differences(before, after) == [
        "model revision 0e9e39f -> 1f2a3b4",
        "quantization (none) -> fp8",
        "--enforce-eager on -> (none)",
        "--kv-cache-dtype (none) -> fp8",
        "env VLLM_ATTENTION_BACKEND FLASH_ATTN -> (none)",
        "driver 550.54 -> 560.35",
        "CUDA 12.4 -> 12.6",
        "SLO ttft_p99_ms 800 -> 500",
        f"corpus {'ab' * 6} -> {'cd' * 6}",
    ]
    assert differences(before, before) == ["corpus unchanged"]


def test_model_identity_hashes_config_and_weight_names_and_sizes(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "awq"}}))
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    first = model_identity(str(folder), ["--kv-cache-dtype", "fp8", "--max-model-len", "4096"])
    assert (first.dtype, first.quantization, first.kv_cache_dtype, first.max_model_len) == ("bfloat16", "awq", "fp8", 4096)
    assert len(first.sha256) == 64
    (folder / "model.safetensors").write_bytes(b"x" * 11)
    assert model_identity(str(folder)).sha256 != first.sha256
    hub = model_identity("org/name@abc123", ["--dtype", "half"])
    assert (hub.name, hub.revision, hub.sha256, hub.dtype) == ("org/name@abc123", "abc123", None, "half")


def test_gpu_identity_from_nvidia_smi():
    rows = "NVIDIA H100 80GB HBM3, 81559, 550.54.15\nNVIDIA H100 80GB HBM3, 81559, 550.54.15\n"
    banner = "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |"
    hw = parse_gpu_query(rows, banner)
    assert hw == Hardware(kind="gpu", model="NVIDIA H100 80GB HBM3", count=2, memory_mib=81559, driver_version="550.54.15", cuda_version="12.4")


# --- points -------------------------------------------------------------------------------------


def _step(concurrency: int, tpot_p50: float, ci: list[float | None], tokens_per_s: float = 2000.0, ok: int = 200):
    return make_step(
        load=LoadSpec(mode="concurrency", value=concurrency),
        requests_ok=ok,
        tpot_ms=LatencySummary(mean=tpot_p50, p50=tpot_p50, ci95={"mean": ci, "p50": ci}),
        output_tokens_per_s=tokens_per_s,
        output_tokens_per_s_ci95=[tokens_per_s * 0.95, tokens_per_s * 1.05],
    )


def _point(pid: str, config: dict, *, knee=(8, 9), confirmed=True, status="ok", steps=(), gpus=1, **more) -> PointResult:
    return PointResult(
        id=pid, config=config, command=["vllm"], status=status, fingerprint=pid, steps=list(steps), gpus=gpus,
        max_passing_concurrency=knee[0], min_failing_concurrency=knee[1], safe_concurrency=knee[0],
        knee_interval=list(knee), confirmed=confirmed, **more,
    )  # fmt: skip


def _sweep(tmp_path: Path, name: str, points: list[PointResult], identity: Identity | None = None) -> Path:
    results = SweepResults(
        started_at="2026-12-01T00:00:00+00:00",
        settings={"server": {"model": "m"}, "slo": {"headroom": 0.1, "tpot_p50_ms": 50}},
        points=points,
        identity=identity or _identity(),
    )
    folder = tmp_path / name
    folder.mkdir()
    (folder / "sweep.json").write_text(results.model_dump_json())
    return folder


def test_points_match_by_configuration_not_by_id(tmp_path):
    base = _sweep(tmp_path, "a", [_point("p0", {"max_model_len": 8192}), _point("p1", {"max_model_len": 32768})])
    new = _sweep(tmp_path, "b", [_point("renamed", {"max_model_len": 8192}), _point("p2", {"max_model_len": 4096})])
    pairs, only_base, only_new = match(load_run(base), load_run(new))
    assert [(b.label, n.label) for b, n in pairs] == [("p0 (max_model_len=8192)", "renamed (max_model_len=8192)")]
    assert [p.label for p in only_base] == ["p1 (max_model_len=32768)"]
    assert [p.label for p in only_new] == ["p2 (max_model_len=4096)"]


def _run_point(knee, confirmed=True, status="ok") -> RunPoint:
    return RunPoint(
        key="k", label="p", config={}, status=status, gpus=1, searched=True, confirmed=confirmed,
        knee_interval=None if knee is None else list(knee), max_passing_concurrency=None, safe_concurrency=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("base", "new", "verdict"),
    [
        ((31, 32), (31, 32), "unchanged"),
        ((31, 32), (30, 31), "regressed"),  # new knee <= 30 < 31 <= baseline's
        ((30, 32), (29, 31), "unchanged"),  # overlapping by one
        ((20, 30), (30, 40), "improved"),  # touching from above: new >= 30 > baseline's <= 29
        ((20, 30), (29, 40), "unchanged"),
        ((30, None), (30, 40), "inconclusive"),  # open: the baseline never failed
        ((None, 4), (None, 2), "inconclusive"),  # nothing passed
    ],
)
def test_knee_verdicts_at_their_edges(base, new, verdict):
    assert capacity_verdict(_run_point(base), _run_point(new))[0] == verdict


def test_an_unconfirmed_knee_is_inconclusive_and_a_lost_point_regressed():
    assert capacity_verdict(_run_point((8, 9)), _run_point((2, 3), confirmed=False)) == (
        "inconclusive",
        "the new run's knee is unconfirmed",
    )
    assert capacity_verdict(_run_point((8, 9), confirmed=None), _run_point((2, 3)))[0] == "inconclusive"
    assert capacity_verdict(_run_point((8, 9)), _run_point(None, status="infeasible"))[0] == "regressed"
    assert capacity_verdict(_run_point(None, status="failed"), _run_point((8, 9)))[0] == "improved"
    assert capacity_verdict(_run_point(None, status="infeasible"), _run_point(None, status="infeasible"))[0] == "unchanged"


def test_a_point_the_adaptive_strategy_did_not_search_is_compared_only_with_its_kind():
    assert capacity_verdict(_run_point((8, 9)), _run_point(None, status="predicted")) == (
        "inconclusive",
        "not searched in the new run (predicted by the adaptive strategy): compared only with a point predicted there too",
    )
    assert capacity_verdict(_run_point(None, status="dominated"), _run_point((8, 9)))[0] == "inconclusive"
    assert capacity_verdict(_run_point(None, status="dominated"), _run_point(None, status="dominated")) == (
        "unchanged", "dominated in both runs",
    )
    assert capacity_verdict(_run_point(None, status="dominated"), _run_point(None, status="predicted"))[0] == "inconclusive"


def test_a_slower_statistic_regresses_its_point_and_names_load_and_statistic(tmp_path):
    # The knee (8, 9) as the steps give it: 9 failed in a window closed before any request ended
    # (no figure to compare there).
    failed_9 = make_step(load=LoadSpec(mode="concurrency", value=9), requests_ok=0, slo_pass=False)
    base = _sweep(tmp_path, "a", [_point("p0", {"mml": 1}, steps=[_step(4, 20.0, [19.0, 21.0]), _step(8, 30.0, [29.0, 31.0]), failed_9])])
    new = _sweep(tmp_path, "b", [_point("p0", {"mml": 1}, steps=[_step(4, 20.2, [19.2, 21.2]), _step(8, 36.0, [35.0, 37.0]), failed_9])])
    c = compare(load_run(base), load_run(new))
    assert c.verdict == "regressed" and c.regressed() and c.tests == 4
    point = c.points[0]
    assert point.verdict == "regressed"
    assert point.reasons == ["tpot_p50_ms at 8 regressed (+20.0%)"]
    verdicts = {(r.value, r.statistic): r.verdict for r in point.statistics}
    assert verdicts == {
        (4, "tpot_p50_ms"): "unchanged",
        (4, "output_tokens_per_s_per_gpu"): "unchanged",
        (8, "tpot_p50_ms"): "regressed",
        (8, "output_tokens_per_s_per_gpu"): "unchanged",
    }


def test_throughput_per_gpu_divides_by_the_points_gpus_and_lower_is_worse(tmp_path):
    base = _sweep(tmp_path, "a", [_point("p0", {}, steps=[_step(4, 20.0, [19.0, 21.0], tokens_per_s=2000.0)], gpus=2)])
    new = _sweep(tmp_path, "b", [_point("p0", {}, steps=[_step(4, 20.0, [19.0, 21.0], tokens_per_s=1500.0)], gpus=2)])
    row = next(r for r in compare(load_run(base), load_run(new)).points[0].statistics if r.statistic == "output_tokens_per_s_per_gpu")
    assert (row.base, row.new, row.verdict) == (1000.0, 750.0, "regressed")


def test_an_open_interval_is_inconclusive_not_unchanged(tmp_path):
    base = _sweep(tmp_path, "a", [_point("p0", {}, knee=(8, None), steps=[_step(4, 20.0, [19.0, None])])])
    new = _sweep(tmp_path, "b", [_point("p0", {}, knee=(8, None), steps=[_step(4, 26.0, [25.0, 27.0])])])
    point = compare(load_run(base), load_run(new)).points[0]
    assert {r.statistic: r.verdict for r in point.statistics}["tpot_p50_ms"] == "inconclusive"
    assert point.verdict == "inconclusive"


def test_the_step_with_the_most_requests_represents_its_load():
    small, large = _step(4, 20.0, [19.0, 21.0], ok=100), _step(4, 22.0, [21.0, 23.0], ok=300)
    unresolved = _step(4, 99.0, [1.0, 200.0], ok=900).model_copy(update={"slo_verdict": "unresolved"})
    assert representative_steps([small, large, unresolved]) == {("concurrency", 4.0): large}


# --- old files, the command ----------------------------------------------------------------------


def test_files_from_before_identities_compare_with_what_they_say(tmp_path, capsys):
    # The fixtures are a version 1 sweep.json and a version 1 replay.json.
    assert json.loads((FIXTURES / "sweep" / "sweep.json").read_text())["schema_version"] == 1
    run = load_run(FIXTURES / "sweep")
    assert not run.identity_recorded and run.identity.vllm_version == "0.32.0" and run.identity.corpus_sha256
    replay = load_run(FIXTURES / "replay" / "replay.json")
    assert replay.kind == "replay" and replay.identity.model.name == ReplayResults.model_validate_json(
        (FIXTURES / "replay" / "replay.json").read_text()
    ).model
    assert main(["compare", str(FIXTURES / "sweep"), str(FIXTURES / "sweep"), "--output", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "changed: corpus unchanged" in out and "predates recorded identities" in out
    assert (tmp_path / "compare.md").is_file() and json.loads((tmp_path / "compare.json").read_text())["kind"] == "sweep"


def test_exit_status_follows_fail_on(tmp_path, capsys):
    base = _sweep(tmp_path, "a", [_point("p0", {}, knee=(31, 32))])
    worse = _sweep(tmp_path, "b", [_point("p0", {}, knee=(20, 21))])
    better = _sweep(tmp_path, "c", [_point("p0", {}, knee=(40, 41))])
    args = ["--no-plots", "--output", str(tmp_path / "out")]
    assert main(["compare", str(base), str(worse), *args]) == 0
    assert main(["compare", str(base), str(worse), *args, "--fail-on", "regression"]) == 1
    assert main(["compare", str(base), str(better), *args, "--fail-on", "regression"]) == 0
    assert main(["compare", str(base), str(better), *args, "--fail-on", "change"]) == 1
    out = capsys.readouterr().out
    assert "p0: regressed (safe 31 -> 20, max passing 31 -> 20, knee [31, 32] -> [20, 21])" in out
    assert "  capacity regressed: knee [20, 21] entirely below [31, 32]" in out


def test_input_errors_are_one_line_and_exit_2(tmp_path, capsys):
    sweep = _sweep(tmp_path, "a", [_point("p0", {})])
    assert main(["compare", str(sweep), str(FIXTURES / "replay")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"planner compare: error: {sweep / 'sweep.json'} is a sweep and {FIXTURES / 'replay' / 'replay.json'}"
        " a replay; compare a sweep with a sweep"
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sweep.json").write_text('{"schema_version": 3,\n "started_at": }')
    assert main(["compare", str(sweep), str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"planner compare: error: {broken / 'sweep.json'}:2: not valid JSON") and "\n" not in err


def test_an_invalid_fail_on_from_the_environment_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PLANNER_FAIL_ON", "regresion")
    sweep = _sweep(tmp_path, "a", [_point("p0", {})])
    assert main(["compare", str(sweep), str(sweep), "--no-plots"]) == 2
    assert capsys.readouterr().err.strip() == (
        "planner compare: error: --fail-on (or PLANNER_FAIL_ON) is 'regresion'; valid: none, regression, change"
    )


def test_without_nvidia_smi_the_hardware_is_the_cpu():
    hw = hardware(nvidia_smi="no-such-nvidia-smi")
    assert hw.kind == "cpu" and hw.count >= 1 and hw.seen_from == "local"


def test_a_replay_hashes_the_served_model_folder_when_it_is_here(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    found = served_model_files(Identity(), str(tmp_path))
    assert found.model.dtype == "float16" and len(found.model.sha256) == 64
    assert served_model_files(Identity(), "fake-model") == Identity()


def test_min_change_keeps_a_small_significant_change_unchanged(tmp_path):
    base = _sweep(tmp_path, "a", [_point("p0", {}, steps=[_step(4, 20.0, [19.9, 20.1])])])
    new = _sweep(tmp_path, "b", [_point("p0", {}, steps=[_step(4, 20.6, [20.5, 20.7])])])
    rows = lambda c: {r.statistic: r.verdict for r in c.points[0].statistics}  # noqa: E731
    assert rows(compare(load_run(base), load_run(new)))["tpot_p50_ms"] == "regressed"  # +3%, tight intervals
    assert rows(compare(load_run(base), load_run(new), min_change=0.05))["tpot_p50_ms"] == "unchanged"
    assert main(["compare", str(base), str(new), "--no-plots", "--fail-on", "regression", "--min-change", "0.05"]) == 0
    assert main(["compare", str(base), str(new), "--no-plots", "--fail-on", "regression"]) == 1


def test_against_a_file_from_before_identities_only_what_both_say_is_compared(tmp_path):
    old = json.loads((FIXTURES / "sweep" / "sweep.json").read_text())
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps(old))
    recorded = SweepResults.model_validate(old).model_copy(
        update={"identity": _identity(vllm_version="0.32.0", model=ModelIdentity(name=old["settings"]["server"]["model"]))}
    )
    recorded = recorded.model_copy(
        update={"identity": recorded.identity.model_copy(update={"corpus_sha256": recorded.run.corpus.sha256, "slo": recorded.settings.slo.bounds()})}
    )
    new = tmp_path / "new"
    new.mkdir()
    (new / "sweep.json").write_text(recorded.model_dump_json())
    c = compare(load_run(folder), load_run(new))
    # Hardware, flags, env and the planner's version are unknown in the old file: not changes.
    assert c.identity_changes == ["corpus unchanged"]
    assert not c.base_identity_recorded and c.new_identity_recorded


def test_what_bound_each_search_is_compared_with_the_undecided_rules_apart(tmp_path, capsys):
    base = _sweep(tmp_path, "a", [_point("p0", {}, knee=(31, 32), binding_constraint="tpot_p50_ms")])
    new = _sweep(tmp_path, "b", [_point(
        "p0", {}, knee=(20, 21), binding_constraint="kv_cache_usage_max",
        binding_undecided=["tpot_p50_ms: undecided after 13 requests"],
    )])
    assert main(["compare", str(base), str(new), "--no-plots", "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert (
        "knee [31, 32] -> [20, 21], bound by tpot_p50_ms -> kv_cache_usage_max"
        " (undecided there: tpot_p50_ms: undecided after 13 requests))"
    ) in out


def test_capacity_compares_the_knee_bands_from_every_step_not_single_numbers():
    def banded(knee, band) -> RunPoint:
        return RunPoint(
            key="k", label="p", config={}, status="ok", gpus=1, searched=True, confirmed=True,
            knee_interval=list(knee), max_passing_concurrency=knee[0], safe_concurrency=None, knee_range=list(band),
        )  # fmt: skip

    # Run 1 and run 2 of issue 35: their knee intervals [50, 51] and [43, 45] are disjoint, a
    # "regression" by single numbers; their bands from every step overlap: 48-52 were contested.
    run1, run2 = banded((50, 51), (50, 51)), banded((43, 45), (43, 53))
    assert capacity_verdict(run1, run2) == ("unchanged", "knee band [43, 53] overlaps [50, 51]")
    assert capacity_verdict(run1, banded((40, 41), (40, 42))) == ("regressed", "knee band [40, 42] entirely below [50, 51]")
    assert capacity_verdict(run1, banded((60, 61), (49, None)))[1] == "the new run's knee band is open ([49, ?])"


def test_a_sweep_file_is_compared_by_the_band_its_steps_give(tmp_path):
    def verdict_step(c: int, verdict: str):
        return make_step(load=LoadSpec(mode="concurrency", value=c), slo_pass=verdict == "pass", slo_verdict=verdict)

    contested = [verdict_step(c, v) for c, v in ((43, "pass"), (48, "pass"), (48, "fail"), (50, "fail"), (43, "pass"))]
    base = _sweep(tmp_path, "a", [_point("p0", {"max_model_len": 8192}, knee=(48, 50), steps=contested)])
    clean = [verdict_step(c, v) for c, v in ((40, "pass"), (44, "fail"), (40, "pass"))]
    new = _sweep(tmp_path, "b", [_point("p0", {"max_model_len": 8192}, knee=(40, 44), steps=clean)])
    point = compare(load_run(base), load_run(new)).points[0]
    assert (point.capacity.base_knee_range, point.capacity.new_knee_range) == ([43, 50], [40, 44])
    assert (point.capacity.base_knee_fit, point.capacity.new_knee_fit) == (43, 40)
    assert point.capacity.verdict == "unchanged" and point.capacity.reason == "knee band [40, 44] overlaps [43, 50]"
