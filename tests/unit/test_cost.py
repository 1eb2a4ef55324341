"""What a measured point costs (planner.cost) and where the report and the sweep's table show it."""

from __future__ import annotations

import shutil

import pytest
from rich.console import Console

from planner.cost import HOURS_PER_MONTH, Price, fleet_cost, money, point_cost, prices
from planner.errors import ConfigError
from planner.report import write_report
from planner.sweep.config import load_settings
from planner.tables import sweep_table
from tests.fakes.results import FIXTURES, sweep_fixture


def test_a_gpu_type_matches_a_whole_word_of_the_gpu_model_and_the_longest_wins():
    p = prices([], {"H100": 3.0, "H100 80GB HBM3": 3.2, "L40S": 1.1})
    assert p.for_gpu("NVIDIA H100 80GB HBM3") == Price(3.2, "[cost] gpu_hour H100 80GB HBM3")
    assert p.for_gpu("NVIDIA H100 NVL") == Price(3.0, "[cost] gpu_hour H100")
    assert p.for_gpu("nvidia l40s") == Price(1.1, "[cost] gpu_hour L40S")
    assert p.for_gpu("NVIDIA H1000") is None
    assert p.for_gpu(None) is None


def test_flags_come_before_the_config():
    p = prices(["H100=2.5"], {"H100": 3.0})
    assert p.for_gpu("NVIDIA H100 80GB HBM3") == Price(2.5, "--gpu-hour-price H100")
    every = prices(["1.75"], {"H100": 3.0})
    assert every.for_gpu(None) == Price(1.75, "--gpu-hour-price")


@pytest.mark.parametrize("flag", ["-1", "abc", "=2", "H100=0", "nan"])
def test_a_bad_price_is_named(flag):
    with pytest.raises(ConfigError, match="--gpu-hour-price"):
        prices([flag])


def test_config_prices_are_validated(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text('[server]\nmodel = "m"\n[cost]\ngpu_hour = { H100 = 0 }\n')
    with pytest.raises(ConfigError, match=r"sweep.toml:4: cost.gpu_hour: gpu_hour 'H100': 0 is not a price"):
        load_settings(config)
    config.write_text('[server]\nmodel = "m"\n[cost]\ngpu_hour = { H100 = 2.49 }\n')
    assert load_settings(config).cost.gpu_hour == {"H100": 2.49}


def test_point_and_fleet_costs():
    c = point_cost(Price(2.0, "x"), gpus=2, output_tokens_per_s_per_gpu=500.0)
    assert c.per_replica_hour == 4.0
    # $2 buys 500 x 3600 = 1.8M tokens on one GPU.
    assert c.per_million_output_tokens == pytest.approx(2.0 / 1.8)
    assert point_cost(Price(2.0, "x"), 1, None).per_million_output_tokens is None
    f = fleet_cost(Price(2.0, "x"), replicas=3, gpus_per_replica=2)
    assert (f.gpus, f.per_hour, f.per_month) == (6, 12.0, 12.0 * HOURS_PER_MONTH)
    assert (money(1234.5), money(0.8315), money(None)) == ("$1,234.50", "$0.832", "-")


def test_the_report_prices_measured_points_and_the_fleet(tmp_path):
    folder = tmp_path / "sweep"
    shutil.copytree(FIXTURES / "sweep", folder)
    write_report(folder, target_rps=5, gpu_hour_price=["2.5"])
    text = (folder / "report.md").read_text()
    section = text.split("## Cost", 1)[1].split("\n## ", 1)[0]
    assert "| `mml8192-gmu0.85-tp2` | unrecorded | 2 | $2.50 (--gpu-hour-price) | $5.00 | $1.04 |" in section
    assert "mml32768-gmu0.85-tp1" not in section  # infeasible: never priced
    assert "| `mml8192-gmu0.85-tp2` | 1 | 2 | $5.00 | $3,650.00 |" in section


def test_no_price_no_cost_section(tmp_path):
    folder = tmp_path / "sweep"
    shutil.copytree(FIXTURES / "sweep", folder)
    write_report(folder)
    assert "## Cost" not in (folder / "report.md").read_text()


def _rendered(table) -> str:
    console = Console(width=300, record=True)
    console.print(table)
    return console.export_text()


def test_the_sweep_table_shows_cost_when_the_config_prices_the_gpus():
    results = sweep_fixture()
    assert "$/h/replica" not in _rendered(sweep_table(results))
    results.settings.__pydantic_extra__["cost"] = {"gpu_hour": {"H100": 2.0}}
    for p in results.points:
        p.gpu_model = "NVIDIA H100 80GB HBM3"
    text = _rendered(sweep_table(results))
    row = next(line for line in text.splitlines() if "mml8192-gmu0.85-tp2" in line)
    assert "$4.00" in row and "$0.832" in row


def test_the_sweep_table_takes_flag_prices_over_the_config():
    results = sweep_fixture()
    row = next(line for line in _rendered(sweep_table(results, ["1.5"])).splitlines() if "mml8192-gmu0.85-tp2" in line)
    assert "$3.00" in row


def test_a_mistyped_sweep_price_fails_before_the_sweep_runs(tmp_path, capsys):
    from planner.cli import main

    config = tmp_path / "sweep.toml"
    config.write_text('[server]\nmodel = "m"\n[gpus]\ndevices = "none"\n')
    assert main(["sweep", "--config", str(config), "--output", str(tmp_path / "out"), "--gpu-hour-price", "H100=abc"]) == 2
    assert "--gpu-hour-price 'H100=abc'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
