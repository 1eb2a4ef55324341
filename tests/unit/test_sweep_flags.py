"""`planner sweep` from flags alone (no --config), and flags over a file."""

from __future__ import annotations

import os

import pytest

from planner.cli import main

PROMPTS = "prompts/prod.jsonl"


@pytest.fixture(autouse=True)
def no_planner_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("PLANNER_")]:
        monkeypatch.delenv(key)


def dry_run(capsys, *args: str) -> tuple[int, list[str], str]:
    rc = main(["sweep", *args, "--dry-run"])
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err


def test_a_sweep_from_flags_alone(capsys, tmp_path):
    rc, lines, _ = dry_run(
        capsys, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--grid", "max_model_len=8192,32768",
        "--grid", "gpu_memory_utilization=0.85,0.9", "--grid", "kv_cache_dtype=fp8", "--slo", "ttft_p99_ms=800",
        "--prompts", PROMPTS, "--output", str(tmp_path),
    )  # fmt: skip
    assert rc == 0
    assert lines[0] == "4 points; server command: vllm serve"
    # A one-value axis is in every command but not in the ids.
    assert [line.split(":")[0] for line in lines[1:9:2]] == ["01-mml8192-gmu0.85", "02-mml8192-gmu0.9", "03-mml32768-gmu0.85", "04-mml32768-gmu0.9"]
    assert lines[1].endswith(
        "vllm serve --model meta-llama/Llama-3.1-8B-Instruct --host 127.0.0.1 --port '<free port>' "
        "--max-model-len 8192 --gpu-memory-utilization 0.85 --kv-cache-dtype fp8"
    )
    assert all(line.startswith("  expected duration unknown") for line in lines[2:9:2])


def test_flags_override_the_files_axis_and_keep_the_rest(capsys, tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(
        f'prompts = "{os.path.abspath(PROMPTS)}"\n[server]\nmodel = "org/m"\n'
        "[grid]\nmax_model_len = [4096]\ngpu_memory_utilization = [0.9]\n[slo]\ntpot_p99_ms = 50\n"
    )
    rc, lines, _ = dry_run(capsys, "--config", str(config), "--grid", "max_model_len=8192,16384", "--output", str(tmp_path))
    assert rc == 0
    assert [line.split(":")[0] for line in lines[1:5:2]] == ["01-mml8192", "02-mml16384"]
    assert "--gpu-memory-utilization 0.9" in lines[1]


@pytest.mark.parametrize(
    ("args", "err"),
    [
        ([], "planner sweep: error: give --config FILE (see examples/), or --model for a sweep from flags (with --grid, --slo and --prompts)\n"),
        (["--model", "m", "--grid", "max_model_len=-1", "--slo", "ttft_p99_ms=abc"],
         "planner sweep: error: invalid sweep settings:\n  grid.max_model_len: -1 must be >= 1\n  slo: SLO ttft_p99_ms: 'abc' is not a number\n"),
    ],
)  # fmt: skip
def test_bad_flags_get_the_files_validation_messages(capsys, tmp_path, args, err):
    rc, _, stderr = dry_run(capsys, *args, "--output", str(tmp_path))
    assert (rc, stderr) == (2, err)


def test_a_malformed_grid_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--model", "m", "--grid", "max_model_len", "--dry-run"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith("error: argument --grid: --grid 'max_model_len': expected KEY=VALUE[,VALUE...]\n")
