"""The tiny model builder, run the way the Makefile runs it (scripts/build-tiny-model.sh)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.support import BUILD_SCRIPT, TinyModel

pytestmark = pytest.mark.e2e


def _build(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD_SCRIPT), str(out)], capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(600)
def test_build_is_deterministic_and_reused(tmp_path: Path, tiny_model: TinyModel) -> None:
    out = tmp_path / "tiny"
    first = _build(out)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"tinymodel: built {out}")

    started = time.perf_counter()
    second = _build(out)
    reuse_s = time.perf_counter() - started
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith(f"tinymodel: reusing {out}")
    # Reuse reads one JSON file and stats the others; torch is never imported.
    assert reuse_s < 5.0

    info = json.loads((out / "build-info.json").read_text())
    reference = json.loads((tiny_model.path / "build-info.json").read_text())
    if reference["params"] == info["params"]:
        # Same parameters, separate builds: the same weights, byte for byte.
        assert info["weights_sha256"] == reference["weights_sha256"]
    assert info["files"] == {p.name: p.stat().st_size for p in out.iterdir() if p.name != "build-info.json"}

    built = TinyModel(path=out, config=json.loads((out / "config.json").read_text()))
    assert built.config["num_hidden_layers"] * built.kv_bytes_per_token_per_layer == info["kv_bytes_per_token"] == 256
    assert built.config["max_position_embeddings"] >= 8192
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "add_generation_prompt" in tokenizer_config["chat_template"]
    assert len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]) == built.config["vocab_size"]


@pytest.mark.timeout(120)
def test_a_folder_holding_something_else_is_left_alone(tmp_path: Path) -> None:
    foreign = tmp_path / "not-a-model"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me\n")
    result = _build(foreign)
    assert result.returncode == 2
    assert "holds no build-info.json" in result.stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
