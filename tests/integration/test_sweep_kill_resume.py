"""Nothing measured is lost: the planner SIGKILLed at many random instants, each kill followed by
--resume, and a disk that fills up while sweep.json is written."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.cli import main
from planner.sweep.lock import LOCK_FILE
from planner.sweep.results import SweepResults
from tests.fakes.sweep_files import ROOT
from tests.fakes.fault_sweeps import fake_vllm_processes, wait_until_gone, write_fault_config
from tests.integration.stopping import reap

FINISHED = {"ok", "infeasible", "predicted_infeasible"}


def start_sweep(cfg: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "planner", "sweep", "--config", str(cfg), "--output", str(out), *extra],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def read_results(out: Path) -> SweepResults | None:
    """sweep.json as it is on disk: absent, or whole (a parse error fails the test)."""
    path = out / "sweep.json"
    if not path.exists():
        return None
    return SweepResults.model_validate_json(path.read_bytes())


def step_key(step) -> tuple:
    return (step.started_at, step.load.mode, step.load.value, step.window_s)


@pytest.mark.timeout(420)
def test_sigkill_at_random_instants_then_resume_loses_and_duplicates_nothing(tmp_path):
    cfg = write_fault_config(tmp_path, kv_bytes=["64K", "4M", "8M"])
    out = tmp_path / "out"
    rng = random.Random(32)
    finished: dict[str, dict] = {}  # every point seen finished on disk, as it was then
    kills = 0
    for attempt in range(9):
        proc = start_sweep(cfg, out, *(["--resume"] if attempt else []))
        try:
            # Instants spread over start-up (imports, the version probe), the server's start, steps
            # and the writes between them.
            time.sleep(rng.uniform(0.5, 9.0))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.communicate(timeout=60)
        finally:
            reap(proc)
        # The launcher's reaper stops a dead planner's servers within their stop grace.
        assert wait_until_gone(lambda: fake_vllm_processes(cfg), 20) == [], "a killed planner left its server behind"
        results = read_results(out)
        if results is None:
            continue
        assert not list(out.glob(".sweep.json.*.tmp")) or kills, "only a kill leaves a temporary behind"
        for p in results.points:
            if p.status in FINISHED:
                if p.id in finished:
                    assert p.model_dump() == finished[p.id], f"{p.id}: a finished point changed on --resume"
                finished[p.id] = p.model_dump()
    assert kills >= 5, "most runs must have been killed, not finished"

    assert main(["sweep", "--config", str(cfg), "--output", str(out), "--resume"]) == 0
    final = read_results(out)
    assert [p.status for p in final.points] == ["infeasible", "ok", "ok"]
    for p in final.points:
        if p.id in finished:
            assert p.model_dump() == finished[p.id], f"{p.id}: a finished point was re-run or changed"
        keys = [step_key(s) for s in p.steps]
        assert len(keys) == len(set(keys)), f"{p.id}: a step appears twice"
    assert not list(out.glob(".sweep.json.*.tmp")), "the resumed sweep removed the killed writers' temporaries"
    assert not (out / LOCK_FILE).exists()
    assert fake_vllm_processes(cfg) == []
    # Steps a killed run had measured in a point it did not finish are in a copy, not gone.
    for copy in out.glob("sweep.before-resume-*.json"):
        SweepResults.model_validate_json(copy.read_bytes())


@pytest.mark.timeout(300)
def test_a_planner_killed_just_after_a_point_finished_reuses_it_byte_for_byte(tmp_path):
    # The soak's find (benchmarks/soak.py, one hour): random instants seldom land between a point's
    # save as finished and the sweep's end, where the sweep used to fill in the point's
    # answer_source. Here the kill lands there on purpose: as soon as sweep.json shows the first
    # point searched to its end, while the next one runs.
    cfg = write_fault_config(tmp_path, kv_bytes=["4M", "8M"])
    out = tmp_path / "out"
    proc = start_sweep(cfg, out)
    seen: str | None = None
    try:
        deadline = time.monotonic() + 120
        while seen is None and time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                results = read_results(out)
                first = results.points[0] if results is not None else None
                if first is not None and first.status == "ok":
                    proc.send_signal(signal.SIGKILL)
                    seen = first.model_dump_json()
            time.sleep(0.05)
        proc.communicate(timeout=60)
    finally:
        reap(proc)
    assert seen is not None and proc.returncode == -signal.SIGKILL, "the kill did not land after the first point finished"
    assert wait_until_gone(lambda: fake_vllm_processes(cfg), 20) == []
    assert main(["sweep", "--config", str(cfg), "--output", str(out), "--resume"]) == 0
    final = read_results(out)
    assert final.points[0].model_dump_json() == seen, "a finished point changed on --resume"
    assert final.points[0].answer_source == "searched" and final.points[1].status == "ok"


def can_mount_tmpfs(where: Path) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


@contextlib.contextmanager
def small_filesystem(where: Path):
    """A 2 MiB tmpfs at `where` (root only): a disk the test can fill."""
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path) -> Path:
    """Write a file in `folder` until its filesystem has no byte left."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler


class _FullDiskOs:
    """replay.atomic's `os`, but once armed, fsync lets `passes` more writes through and then fails
    with ENOSPC, as a full disk fails a write: the injection this test uses where it cannot mount a
    filesystem of its own."""

    def __init__(self) -> None:
        self.passes: int | None = None

    def __getattr__(self, name: str):
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        if self.passes == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.passes is not None:
            self.passes -= 1
        os.fsync(fd)


@pytest.mark.timeout(300)
def test_a_full_disk_stops_the_sweep_in_one_line_and_keeps_the_previous_file(tmp_path, monkeypatch, capsys):
    disk = tmp_path / "disk"
    mounted = can_mount_tmpfs(disk)
    with small_filesystem(disk) if mounted else contextlib.nullcontext():
        out = disk / "out"
        cfg = write_fault_config(tmp_path / "cfg", kv_bytes=["4M", "8M"])
        if mounted:
            proc = start_sweep(cfg, out)
            try:
                seen = None
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and proc.poll() is None:
                    seen = read_results(out)
                    if seen and seen.points[0].steps:
                        break
                    time.sleep(0.1)
                assert seen and seen.points[0].steps, "the first step was never saved"
                filler = fill(disk)
                _, err = proc.communicate(timeout=120)
            finally:
                reap(proc)
            status = proc.returncode
        else:
            import replay.atomic

            full = _FullDiskOs()
            monkeypatch.setattr(replay.atomic, "os", full)

            class ArmAfterFirstStep:
                def step_finished(self, step) -> None:
                    # Called before the step is saved: that save goes through, the next fails.
                    if full.passes is None:
                        full.passes = 1

                def __getattr__(self, name):
                    return lambda *a, **k: None

            import planner.commands.sweep as sweep_cmd

            real = sweep_cmd.run_sweep
            monkeypatch.setattr(
                sweep_cmd, "run_sweep", lambda *a, observers, **k: real(*a, observers=[*observers, ArmAfterFirstStep()], **k)
            )
            status = main(["sweep", "--config", str(cfg), "--output", str(out)])
            err = capsys.readouterr().err
            filler = None
        assert status == 2
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"planner sweep: error: {out / 'sweep.json'}: cannot save the results: No space left on device (")
        assert " free on its filesystem, the file needs " in line
        assert line.endswith("is intact. Make room, then run the same command with --resume")
        # The file on disk is the last one written whole, with the step measured before the disk filled.
        kept = read_results(out)
        assert kept.points[0].steps
        assert not list(out.glob(".sweep.json.*.tmp")), "the failed write left no temporary behind"
        assert not (out / LOCK_FILE).exists()
        assert wait_until_gone(lambda: fake_vllm_processes(cfg), 20) == []
        if filler is not None:
            filler.unlink()
