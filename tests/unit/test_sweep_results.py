"""sweep.json's schema: version 1 files (run metadata inside `settings`) still load.

The report tests render the same version 1 fixture end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.estimate import Estimate, estimate_point
from planner.sweep.results import SCHEMA_VERSION, CorpusInfo, CpuSplitInfo, NotPredicted, PointResult, RunInfo, SweepResults

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "sweep" / "sweep.json"
CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"


def test_version_1_run_metadata_moves_from_settings_to_run():
    raw = json.loads(FIXTURE.read_text())
    assert raw["schema_version"] == 1 and "run" not in raw
    sweep = SweepResults.model_validate(raw)
    assert sweep.schema_version == SCHEMA_VERSION == 3
    assert sweep.identity is None
    assert sweep.run == RunInfo(
        corpus=CorpusInfo(path="prompts/prod.jsonl", sha256="9f2c" * 16, requests=500),
        vllm_version="0.32.0",
        gpus_found=["0", "1", "2", "3"],
    )
    assert sorted(sweep.model_dump(mode="json")["settings"]) == ["grid", "prompts", "server", "slo"]
    assert sweep.settings.server.model_dump(mode="json") == raw["settings"]["server"]
    assert [p.id for p in sweep.points] == [p["id"] for p in raw["points"]]


def test_a_migrated_file_round_trips_unchanged():
    sweep = SweepResults.model_validate_json(FIXTURE.read_text())
    saved = sweep.model_dump(mode="json")
    assert saved["schema_version"] == 3
    assert saved["identity"] is None
    assert saved["run"] == {
        "corpus": {"path": "prompts/prod.jsonl", "sha256": "9f2c" * 16, "requests": 500},
        "vllm_version": "0.32.0",
        "gpus_found": ["0", "1", "2", "3"],
        "cpus_split": None,
    }
    assert SweepResults.model_validate(saved) == sweep


def test_version_2_loads_with_its_identity_unknown():
    raw = SweepResults.model_validate_json(FIXTURE.read_text()).model_dump(mode="json")
    del raw["identity"]
    raw["schema_version"] = 2
    sweep = SweepResults.model_validate(raw)
    assert sweep.schema_version == 3 and sweep.identity is None
    assert sweep.run.vllm_version == "0.32.0"
    assert [p.id for p in sweep.points] == [p["id"] for p in raw["points"]]


def test_saved_settings_are_typed_where_the_report_reads_them():
    sweep = SweepResults.model_validate_json(FIXTURE.read_text())
    raw = json.loads(FIXTURE.read_text())["settings"]
    assert sweep.settings.server.model == raw["server"]["model"]
    assert sweep.settings.slo.headroom == raw["slo"]["headroom"]
    assert sweep.settings.slo.bounds() == {k: float(v) for k, v in raw["slo"].items() if k != "headroom"}
    # Sections the report does not read are kept as they were saved.
    assert sweep.model_dump(mode="json")["settings"]["grid"] == raw["grid"]


def test_a_bound_this_planner_does_not_know_is_kept_but_not_a_bound():
    sweep = SweepResults.model_validate(
        {"started_at": "x", "settings": {"slo": {"headroom": 0.2, "ttft_p99_ms": 500, "made_up_slo": 3}}}
    )
    assert sweep.settings.slo.bounds() == {"ttft_p99_ms": 500.0}
    assert sweep.model_dump(mode="json")["settings"]["slo"]["made_up_slo"] == 3


def _point(**fields) -> PointResult:
    return PointResult(id="p", config={}, command=[], status="ok", fingerprint="f", **fields)


@pytest.mark.parametrize("via", ["json", "python"])
def test_a_prediction_round_trips_as_its_model(via):
    estimate = estimate_point(str(CONFIGS / "llama-3-8b.json"), {"max_model_len": 8192}, gpu="h100-80gb")
    for prediction in (estimate, NotPredicted(error="no config.json")):
        point = _point(prediction=prediction)
        back = (
            PointResult.model_validate_json(point.model_dump_json())
            if via == "json"
            else PointResult.model_validate(point.model_dump(mode="json"))
        )
        assert type(back.prediction) is type(prediction)
        assert back.prediction == prediction
    assert isinstance(estimate, Estimate)


def test_an_older_prediction_that_no_longer_parses_is_kept_as_saved():
    old = {"kv_cache_tokens": 17022, "fits": True}
    point = PointResult.model_validate_json(_point(prediction=old).model_dump_json())
    assert point.prediction == old


def test_the_cpu_split_is_a_model():
    run = RunInfo.model_validate({"cpus_split": {"server": [0, 1], "client": [2]}})
    assert run.cpus_split == CpuSplitInfo(server=[0, 1], client=[2])


def test_saved_settings_keep_their_order():
    saved = {"server": {"command": ["vllm", "serve"], "model": "m", "args": []}, "grid": {}, "slo": {"ttft_p99_ms": 800, "headroom": 0.1}}
    sweep = SweepResults.model_validate({"started_at": "x", "settings": saved})
    dumped = sweep.model_dump(mode="json")["settings"]
    assert json.dumps(dumped) == json.dumps(saved)
    assert json.loads(sweep.model_dump_json())["settings"] == saved and list(json.loads(sweep.model_dump_json())["settings"]) == list(saved)
