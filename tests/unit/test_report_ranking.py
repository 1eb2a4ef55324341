"""`planner report A/ B/ --target-rps R`: the cheapest measured configuration across sweeps."""

from __future__ import annotations

from pathlib import Path

from planner.cli import main
from planner.sweep.results import SweepResults, write_results
from tests.fakes.results import sweep_fixture


def _sweep(folder: Path, gpu: str, price: float | None, *, safe_scale: float = 1.0) -> Path:
    """The fixture sweep as if run on `gpu` (priced in its config unless price is None)."""
    data = sweep_fixture().model_dump(mode="json")
    if price is not None:
        data["settings"]["cost"] = {"gpu_hour": {gpu.split()[-1]: price}}
    for p in data["points"]:
        p["gpu_model"] = gpu
        if p["safe_concurrency"]:
            p["safe_concurrency"] = max(1, int(p["safe_concurrency"] * safe_scale))
    data["points"][1]["status"] = "predicted_infeasible"
    data["points"][1]["safe_concurrency"] = None
    folder.mkdir(parents=True)
    write_results(folder, SweepResults.model_validate(data))
    return folder


def test_the_cheapest_configuration_across_gpu_types(tmp_path, capsys):
    h100 = _sweep(tmp_path / "h100", "NVIDIA H100", 4.0)
    l40s = _sweep(tmp_path / "l40s", "NVIDIA L40S", 1.0)
    assert main(["report", str(h100), str(l40s), "--target-rps", "5"]) == 0
    out = capsys.readouterr().out
    # Same measured figures, a quarter of the price: every L40S option ranks first.
    assert "Cheapest: `mml8192-gmu0.85-tp2` from " in out and "l40s" in out.split("Cheapest:")[1].split("\n")[0]
    assert "2 GPUs, $2.00/hour, $1,460.00/month" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 12  # 6 sized points per sweep
    assert [("l40s" in r) for r in rows] == [True] * 6 + [False] * 6
    assert "| itl_p99_ms |" in rows[0] and "5 req/s at 5.22 each (interpolated between 32 and 48)" in rows[0]
    # Never priced as if measured:
    assert "`mml8192-gmu0.95-tp1`: not measured to pass the SLOs (status predicted_infeasible)" in out
    assert "`mml32768-gmu0.85-tp1`: not measured to pass the SLOs (status infeasible)" in out


def test_a_gpu_without_a_price_is_left_out_not_guessed(tmp_path, capsys):
    h100 = _sweep(tmp_path / "h100", "NVIDIA H100", None)
    l40s = _sweep(tmp_path / "l40s", "NVIDIA L40S", 1.0)
    assert main(["report", str(h100), str(l40s), "--target-concurrency", "100"]) == 0
    out = capsys.readouterr().out
    assert "no price for its GPU (NVIDIA H100); give --gpu-hour-price" in out
    assert main(["report", str(h100), str(l40s), "--target-concurrency", "100", "--gpu-hour-price", "H100=0.5"]) == 0
    out = capsys.readouterr().out
    assert "Cheapest: `mml8192-gmu0.85-tp2` from " in out and "h100" in out.split("Cheapest:")[1].split("\n")[0]
    assert "100 concurrent at 43 each" in out


def test_several_folders_need_a_target(tmp_path, capsys):
    a = _sweep(tmp_path / "a", "NVIDIA H100", 4.0)
    b = _sweep(tmp_path / "b", "NVIDIA L40S", 1.0)
    assert main(["report", str(a), str(b)]) == 2
    assert "needs a target: --target-rps or --target-concurrency" in capsys.readouterr().err
