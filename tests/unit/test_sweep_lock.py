"""One results folder, one sweep (planner.sweep.lock), and the earlier sweep.json that --resume
reads or --restart moves aside (planner.sweep.earlier)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from planner.cli import main
from planner.sweep.earlier import EarlierUnreadable, read_earlier, set_aside
from planner.sweep.lock import LOCK_FILE, SweepLock, SweepLocked
from tests.fakes.sweep_files import ROOT, write_ray_sweep_config

HOLD = """
import sys, time
from pathlib import Path
from planner.sweep.lock import SweepLock
with SweepLock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/out."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield out, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_a_second_sweep_is_refused_naming_the_pid_that_holds_the_folder(holder):
    out, proc = holder
    with pytest.raises(SweepLocked) as exc, SweepLock(out):
        pass
    assert f"another sweep (pid {proc.pid}) is writing results into this folder" in str(exc.value)
    assert str(out / LOCK_FILE) in str(exc.value) and "--output" in str(exc.value)


def test_the_cli_refuses_a_second_sweep_in_one_line_before_starting_anything(holder, capsys):
    out, proc = holder
    cfg = write_ray_sweep_config(out.parent / "cfg", tp=[1], kv_bytes=["4M"], executor="local")
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"(pid {proc.pid})" in err
    assert not (out / "sweep.json").exists() and not (out / "points").exists()


def test_the_lock_of_a_sigkilled_sweep_is_taken_over_with_a_message(holder):
    out, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / LOCK_FILE).exists(), "a SIGKILLed holder leaves its lock file"
    notices: list[str] = []
    with SweepLock(out, notice=notices.append):
        assert (out / LOCK_FILE).read_text() == f"pid={os.getpid()} host={socket.gethostname()}\n"
    assert notices == [
        f"{out / LOCK_FILE}: taking over the lock of sweep pid {proc.pid}, which no longer holds it (it ended"
        " without removing its lock file: killed, or its machine restarted)"
    ]
    assert not (out / LOCK_FILE).exists(), "a sweep that ends removes its lock file"


def test_a_lock_is_free_again_once_its_sweep_ends_and_is_taken_without_a_word(tmp_path):
    notices: list[str] = []
    with SweepLock(tmp_path, notice=notices.append):
        with pytest.raises(SweepLocked):
            SweepLock(tmp_path).__enter__()
    with SweepLock(tmp_path, notice=notices.append):
        pass
    assert notices == []


def test_a_truncated_sweep_json_names_the_file_and_the_byte(tmp_path):
    path = tmp_path / "sweep.json"
    whole = json.dumps({"schema_version": 3, "started_at": "t", "settings": {}, "points": []}, indent=1)
    path.write_text(whole[:40])
    with pytest.raises(EarlierUnreadable) as exc:
        read_earlier(path)
    assert str(exc.value).startswith(f"{path}: not valid JSON at byte 39 of 40 (line 3, column 16: Unterminated string starting at);")
    assert str(exc.value).endswith("run again with --restart to start over (it moves this file aside, deleting nothing)")
    # Bytes, not characters: the error after a multi-byte character is placed where it is on disk.
    path.write_text('{"started_at": "é", oops}')
    with pytest.raises(EarlierUnreadable, match=r"at byte 21 of 26 "):
        read_earlier(path)
    path.write_bytes(b'{"started_at": "\xff"}')
    with pytest.raises(EarlierUnreadable, match=r"not UTF-8 at byte 16 of 19;"):
        read_earlier(path)
    path.write_text('{"schema_version": 3, "settings": {}, "points": []}')
    with pytest.raises(EarlierUnreadable, match=r"valid JSON but not a sweep's results: started_at: Field required;"):
        read_earlier(path)
    assert read_earlier(tmp_path / "none.json") is None


def test_resume_from_a_corrupt_file_stops_in_one_line_and_restart_moves_it_aside(tmp_path, capsys):
    cfg = write_ray_sweep_config(tmp_path / "cfg", tp=[1], kv_bytes=["4M"], executor="local")
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.json").write_text('{"schema_version": 3, "points": [')
    assert main(["sweep", "--config", str(cfg), "--output", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"planner sweep: error: {out / 'sweep.json'}: not valid JSON at byte 33 of 33 (line 1, column 34: Expecting"
        " value); run again with --restart to start over (it moves this file aside, deleting nothing)"
    )
    assert not (out / LOCK_FILE).exists()
    assert main(["sweep", "--config", str(cfg), "--output", str(out), "--resume", "--restart"]) == 2
    assert "--resume and --restart contradict each other" in capsys.readouterr().err
    notices: list[str] = []
    aside = set_aside(out / "sweep.json", notice=notices.append)
    assert aside.parent == out and aside.name.startswith("sweep.restarted-") and aside.suffix == ".json"
    assert aside.read_text() == '{"schema_version": 3, "points": [' and not (out / "sweep.json").exists()
    assert notices == [f"--restart: the earlier results are kept as {aside}; this sweep starts over"]
    assert set_aside(out / "sweep.json") is None


def test_a_sweep_without_resume_moves_an_earlier_sweep_json_aside_rather_than_overwrite_it(tmp_path):
    (tmp_path / "sweep.json").write_text("{}")
    notices: list[str] = []
    aside = set_aside(tmp_path / "sweep.json", restart=False, notice=notices.append)
    assert aside.name.startswith("sweep.replaced-") and aside.read_text() == "{}"
    assert notices == [
        f"{tmp_path / 'sweep.json'} held an earlier sweep's results, kept as {aside}; this sweep starts over"
        " (--resume continues an earlier sweep instead)"
    ]
    # Twice in one second: a second name, never the first file overwritten.
    (tmp_path / "sweep.json").write_text("[]")
    again = set_aside(tmp_path / "sweep.json", restart=False, notice=notices.append)
    assert again != aside and again.read_text() == "[]" and aside.read_text() == "{}"
