"""sweep.json's schema: version 1 files (run metadata inside `settings`) still load.

The report tests render the same version 1 fixture end to end."""

from __future__ import annotations

import json
from pathlib import Path

from planner.sweep.results import SCHEMA_VERSION, CorpusInfo, RunInfo, SweepResults

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "sweep" / "sweep.json"


def test_version_1_run_metadata_moves_from_settings_to_run():
    raw = json.loads(FIXTURE.read_text())
    assert raw["schema_version"] == 1 and "run" not in raw
    sweep = SweepResults.model_validate(raw)
    assert sweep.schema_version == SCHEMA_VERSION == 2
    assert sweep.run == RunInfo(
        corpus=CorpusInfo(path="prompts/prod.jsonl", sha256="9f2c" * 16, requests=500),
        vllm_version="0.32.0",
        gpus_found=["0", "1", "2", "3"],
    )
    assert sorted(sweep.settings) == ["grid", "prompts", "server", "slo"]
    assert sweep.settings["server"] == raw["settings"]["server"]
    assert [p.id for p in sweep.points] == [p["id"] for p in raw["points"]]


def test_version_2_round_trips_unchanged():
    sweep = SweepResults.model_validate_json(FIXTURE.read_text())
    saved = sweep.model_dump(mode="json")
    assert saved["schema_version"] == 2
    assert saved["run"] == {
        "corpus": {"path": "prompts/prod.jsonl", "sha256": "9f2c" * 16, "requests": 500},
        "vllm_version": "0.32.0",
        "gpus_found": ["0", "1", "2", "3"],
        "cpus_split": None,
    }
    assert SweepResults.model_validate(saved) == sweep

