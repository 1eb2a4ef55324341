"""Every ready sweep in examples/ expands, names its commands and is estimated, with
`planner sweep --dry-run`, against a Hub cache built from the models' configs in
tests/fixtures/model_configs and header-only safetensors (no weights), offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cli import main

ROOT = Path(__file__).parent.parent.parent

# (example, points, what the dry run must say of them)
EXAMPLES = [
    ("h100-llama-8b.toml", 6, ["--model meta-llama/Llama-3.1-8B-Instruct", "--max-model-len 131072 --gpu-memory-utilization 0.95"]),
    ("l4-llama-8b-fp8-kv.toml", 6, ["--kv-cache-dtype fp8", "--max-model-len 32768 --gpu-memory-utilization 0.92 --kv-cache-dtype auto"]),
    ("h100-llama-70b-tp.toml", 4, ["--model meta-llama/Llama-3.1-70B-Instruct", "--tensor-parallel-size 4", "--tensor-parallel-size 8"]),
    ("h100-mixtral-moe.toml", 4, ["--model mistralai/Mixtral-8x7B-Instruct-v0.1", "--tensor-parallel-size 2"]),
    ("ray-multinode-70b.toml", 2, ["--pipeline-parallel-size 2 --nnodes 2"]),
]


@pytest.mark.parametrize(("example", "points", "says"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_each_example_dry_runs_with_an_estimate_for_every_point(offline_hub, capsys, tmp_path, example, points, says):
    rc = main(["sweep", "--config", str(ROOT / "examples" / example), "--dry-run", "--request-duration-s", "20", "--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0].startswith(f"{points} points; server command: vllm serve")
    commands, expected = lines[1 : 1 + 2 * points : 2], lines[2 : 2 + 2 * points : 2]
    assert len(commands) == len(expected) == points
    for text in says:
        assert any(text in c for c in commands), text
    # Every point was estimated from the cached model: a duration from its predicted pool, or
    # the estimate's own reason it cannot start; never "no KV pool" (the model was not read).
    for line in expected:
        assert line.startswith("  expected "), line
        assert "predicts no KV pool" not in line, line


def test_the_l4_example_prunes_only_the_long_bf16_context(offline_hub, capsys, tmp_path):
    main(["sweep", "--config", str(ROOT / "examples" / "l4-llama-8b-fp8-kv.toml"), "--dry-run", "--request-duration-s", "20", "--output", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    refused = [cmd for cmd, exp in zip(lines[1:13:2], lines[2:13:2]) if exp == "  expected to end at start-up: the estimate predicts it does not fit"]
    assert [c.split(":")[0] for c in refused] == ["05-mml32768-kv_cache_dtypeauto"]
