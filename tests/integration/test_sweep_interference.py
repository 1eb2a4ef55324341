"""A CPU-bound process pinned to the fake server's core during a sweep: the planner names the
busy machine before the load, flags the steps it disturbed with the process's pid, measures them
again, and answers as the quiet run does (tests/integration/test_sweep.py: 5 passes, 6 fails).

The sweep runs on two CPUs of this machine, the two that were quietest a moment before: the lower
one is the server's (and the hog's), the other the planner's ([cpus] client = 1). So the hog's
share of the server's CPUs does not depend on how many CPUs the machine has, and the rule judges
that one CPU only. Its precondition is that this CPU is quiet before the hog starts: a machine
whose every CPU is busy would disturb every step, the re-measured ones too, and the test then fails
at once with a message naming the busiest processes (it never skips).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from planner import quiet
from planner.cli import main
from planner.sweep.results import SweepResults
from replay.step.environment import PROC, parse_cpu_busy
from tests.integration.test_sweep import write_config

# The quiet run's answer for this fake (test_sweep.py) and one precision step around it.
QUIET_MAX_PASSING = 5
# Other processes above this share of the server's CPUs disturb a step (the default is 0.1; a
# process spinning on the server's only core takes about half of it from the server).
SHARE = 0.3


def quietest_cpus(n: int, watch_s: float = 1.0) -> list[int]:
    """The `n` CPUs this process may use that were least busy over `watch_s` (sorted)."""
    allowed = sorted(os.sched_getaffinity(0))
    before = parse_cpu_busy((PROC / "stat").read_text())
    time.sleep(watch_s)
    after = parse_cpu_busy((PROC / "stat").read_text())
    return sorted(sorted(allowed, key=lambda c: after.get(c, 0) - before.get(c, 0))[:n])


def stop_on_first_disturbed(results: Path, hog: subprocess.Popen, done: threading.Event) -> None:
    """Kill the hog once a step it disturbed is in the results (they are written as steps end)."""
    while not done.is_set():
        try:
            points = json.loads(results.read_text()).get("points", [])
        except (OSError, ValueError):
            points = []
        if any(f"pid {hog.pid}" in reason for p in points for s in p.get("steps", []) for reason in s.get("disturbed", [])):
            hog.kill()
            return
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_a_process_on_the_servers_core_disturbs_steps_that_are_measured_again(tmp_path, capsys, monkeypatch):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.fail("this test pins the server and the planner apart: it needs 2 CPUs")
    monkeypatch.delenv("PLANNER_REPLAY__ALLOW_INTERFERENCE")
    # The server and the hog on one CPU, the planner on another: the sweep splits the CPUs this
    # process may use, so it may use these two only.
    server_cpu, planner_cpu = cpus = quietest_cpus(2)
    before = quiet.check_machine(
        set(), server_cpus=[server_cpu], planner_cpus=[planner_cpu], watch_s=2.0, busy_share=SHARE
    )
    if before.cpu is None or before.cpu.other_share_server_cpus is None:
        pytest.fail(f"the server's CPU could not be watched here: {before.line}")
    if before.cpu.other_share_server_cpus > SHARE:
        # What the test shows is a step disturbed by one known process and measured again clean;
        # other processes already on the server's CPU would disturb every step.
        pytest.fail(
            f"CPU {server_cpu}, the quietest this test could find for the server, is busy before the test"
            f" ({before.cpu.other_share_server_cpus:.0%} used by other processes, more than {SHARE:.0%}):"
            f" {before.line}. Run it on a machine where one CPU is free."
        )
    cfg = write_config(tmp_path, kv_bytes=["4M"])
    # The server gets the first of the two CPUs, the planner the second ([cpus] client = 1).
    cfg.write_text(cfg.read_text().replace("[replay]\n", f"[replay]\ninterference_cpu_share = {SHARE}\ndisturbed_retries = 3\n")
                   + "\n[cpus]\nclient = 1\n")
    out = tmp_path / "out"
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{server_cpu}}})\nwhile True: pass"],
        start_new_session=True,
    )
    done = threading.Event()
    watcher = threading.Thread(target=stop_on_first_disturbed, args=(out / "sweep.json", hog, done), daemon=True)
    watcher.start()
    try:
        os.sched_setaffinity(0, cpus)
        time.sleep(0.5)
        assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    finally:
        done.set()
        hog.kill()
        hog.wait()
        # The sweep pinned this process to the planner's CPU, and the test to the two.
        os.sched_setaffinity(0, allowed)
    printed = capsys.readouterr().out
    assert "the machine is busy" in printed and f"(pid {hog.pid}," in printed

    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    path = [(int(s.load.value), s.slo_verdict, s.disturbed) for s in point.steps]
    disturbed = [s for s in point.steps if s.disturbed]
    assert disturbed, "the hog disturbed no step"
    first = disturbed[0]
    assert f"pid {hog.pid}" in first.disturbed[0] and "of the server's CPUs" in first.disturbed[0]
    assert first.environment.cpu.server_cpus == [server_cpu]
    assert first.environment.cpu.other_share_server_cpus > SHARE
    # Measured again: the same concurrency has a step after the disturbed one.
    again = [s for s in point.steps[point.steps.index(first) + 1:] if s.load.value == first.load.value]
    assert again
    assert not point.interference_allowed
    report = (out / "report.md").read_text()
    assert f"Disturbed at {int(first.load.value)} (measured again, never used)" in report
    assert "## Environment" in report and f"pid {hog.pid}" in report
    assert point.disturbed_concurrency == [], path
    assert abs(point.max_passing_concurrency - QUIET_MAX_PASSING) <= 1, path
