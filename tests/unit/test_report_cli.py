"""`planner report DIR` through the real command line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from planner.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"


@pytest.mark.timeout(60)
def test_report_command_lists_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay"
    shutil.copytree(FIXTURES / "replay", out)
    assert main(["report", str(out), "--target-rps", "10"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[:2] == [str(out / "report.md"), str(out / "summary.csv")]
    assert all(Path(p).is_file() for p in printed)
    assert "## Fleet sizing" in (out / "report.md").read_text()


def test_missing_results_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"planner report: error: {tmp_path}: holds neither sweep.json nor replay.json; give the folder a sweep or a replay wrote\n"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--target-rps", "0", "must be a positive, finite number"), ("--target-concurrency", "2.5", "is not a whole number")],
)
def test_bad_targets_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path), flag, value])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_target_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PLANNER_TARGET_CONCURRENCY", "0")
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path)])
    assert "'0' must be >= 1 concurrent request" in capsys.readouterr().err
