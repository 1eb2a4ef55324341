"""`planner init`: a sweep file whose grid the estimate chose, that `planner sweep` then runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from planner.cli import main

PROMPTS = Path(__file__).parent.parent.parent / "prompts" / "prod.jsonl"


def init(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["init", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_70b_model_on_h100s_gets_the_sizes_it_fits_and_the_points_it_would_prune(offline_hub, capsys, tmp_path):
    out = tmp_path / "sweep.toml"
    rc, stdout, _ = init(capsys, "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "NVIDIA H100 80GB HBM3", "--prompts", str(PROMPTS), "--output", str(out))
    assert rc == 0
    assert stdout.splitlines() == [
        f"wrote {out}: 12 points, 9 to run (3 ruled out by the estimate)",
        f"see each command: planner sweep --config {out} --dry-run",
        f"run it:           planner sweep --config {out} --output results/sweep",
    ]
    text = out.read_text()
    settings = tomllib.loads(text)
    assert settings["server"]["model"] == "meta-llama/Llama-3.1-70B-Instruct"
    # 141 GB of bf16 weights do not fit on one 80 GB GPU: the sizes start at 2.
    assert settings["grid"] == {"max_model_len": [4096, 32768, 131072], "gpu_memory_utilization": [0.9, 0.95], "tensor_parallel_size": [2, 4]}
    assert settings["estimate"] == {"gpu": "h100-80gb"}
    assert "#   - tensor parallel 2 and 4: 2 is the fewest GPUs it fits on (65.71 GiB of weights per GPU; at 1 it does not fit)" in text
    assert "#   - tensor_parallel_size 2, max_model_len 131072, gpu_memory_utilization 0.95: kv_too_small; the largest max_model_len that fits is 34880" in text
    assert "context lengths from 4096: the corpus's longest request is ~3978 tokens" in text

    # The file is a valid sweep: its dry run lists the 12 points.
    assert main(["sweep", "--config", str(out), "--dry-run", "--output", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.startswith("12 points; server command: vllm serve\n01-mml4096-gmu0.9-tp2: ")


def test_an_8b_model_on_one_h100_without_a_corpus(offline_hub, capsys, tmp_path):
    out = tmp_path / "sweep.toml"
    rc, stdout, _ = init(capsys, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--output", str(out))
    assert rc == 0
    settings = tomllib.loads(out.read_text())
    assert settings["grid"]["tensor_parallel_size"] == [1, 2]
    assert settings["prompts"] == "prompts/prod.jsonl"


@pytest.mark.parametrize(
    ("args", "err"),
    [
        (["--model", "meta-llama/Llama-3.1-8B-Instruct"], "planner init: error: --gpu is required (or PLANNER_GPU): the grid depends on the GPU's memory\n"),
        (["--model", "org/not-cached", "--gpu", "H100"], None),
    ],
)  # fmt: skip
def test_init_errors_are_one_line(offline_hub, capsys, tmp_path, args, err):
    rc, _, stderr = init(capsys, *args, "--output", str(tmp_path / "s.toml"))
    assert rc == 2
    assert stderr == err if err else stderr.startswith("planner init: error: org/not-cached: config.json is not in the Hub cache")
    assert not (tmp_path / "s.toml").exists()


def test_an_existing_file_is_kept_without_force(offline_hub, capsys, tmp_path):
    out = tmp_path / "sweep.toml"
    out.write_text("mine")
    rc, _, stderr = init(capsys, "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--output", str(out))
    assert (rc, stderr, out.read_text()) == (2, f"planner init: error: {out} exists; give --force to overwrite it, or another --output\n", "mine")

