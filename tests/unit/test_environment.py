"""The environment of a step's window: /proc read at open and close, and the rules that call a
step disturbed."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay.results import CpuEnvironment, GpuEnvironment, GpuProcess, GpuState, ProcessUse, StepEnvironment
from replay.search.policy import Probe, disturbed, knee_interval, next_probe, unresolved
from replay.step import environment as env_mod
from replay.step.environment import CpuProbe, Interference, disturbances, parse_pid_stat, parse_proc_stat, tree

HZ = os.sysconf("SC_CLK_TCK")


def pid_stat(pid: int, name: str, ppid: int, pgrp: int, ticks: int, cpu: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    rest = ["S", ppid, pgrp, pgrp, 0, -1, 0, 0, 0, 0, 0, ticks, 0] + [0] * 23 + [cpu] + [0] * 10
    return f"{pid} ({name}) " + " ".join(map(str, rest)) + "\n"


def test_a_pid_stat_line_is_read_after_the_last_parenthesis():
    line = pid_stat(42, "odd (name) x", 1, 42, 250, 3)
    stat = parse_pid_stat(line)
    assert (stat.pid, stat.name, stat.ppid, stat.pgrp, stat.ticks, stat.cpu) == (42, "odd (name) x", 1, 42, 250, 3)
    # This very process, read for real.
    me = parse_pid_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert me.pid == os.getpid() and me.ppid == os.getppid()


def test_proc_stat_gives_all_ticks_and_steal():
    text = "cpu  100 5 50 800 10 1 2 32 0 0\ncpu0 50 2 25 400 5 0 1 16 0 0\n"
    assert parse_proc_stat(text) == (1000, 32)


def test_a_tree_holds_descendants_and_the_process_group():
    procs = {s.pid: s for s in (
        parse_pid_stat(pid_stat(10, "vllm", 1, 10, 0, 0)),
        parse_pid_stat(pid_stat(11, "engine", 10, 10, 0, 0)),
        parse_pid_stat(pid_stat(12, "worker", 11, 12, 0, 0)),
        parse_pid_stat(pid_stat(13, "orphan-of-group", 1, 10, 0, 0)),
        parse_pid_stat(pid_stat(20, "other", 1, 20, 0, 0)),
    )}
    assert tree(procs, {10}) == {10, 11, 12, 13}


def write_proc(root: Path, procs: list[str], steal: int, total_idle: int) -> None:
    for line in procs:
        pid = line.split()[0]
        (root / pid).mkdir(exist_ok=True)
        (root / pid / "stat").write_text(line)
    (root / "stat").write_text(f"cpu  100 0 0 {total_idle} 0 0 0 {steal} 0 0\n")
    (root / "loadavg").write_text("1.50 0.75 0.30 2/300 4242\n")


def test_other_processes_on_the_server_cpus_are_counted_and_named(tmp_path: Path):
    server = [pid_stat(10, "vllm", 1, 10, 0, 0), pid_stat(11, "engine", 10, 10, 0, 0)]
    write_proc(tmp_path, [*server, pid_stat(30, "stress", 1, 30, 0, 0), pid_stat(31, "idle", 1, 31, 0, 1)], 0, 800)
    probe = CpuProbe(lambda: {10}, server_cpus=[0], planner_cpus=[1], proc=tmp_path, background=False)
    probe.window_opened()
    time.sleep(0.05)
    window_s = 0.05
    # In the window: the server used 2 s, `stress` (last on CPU 0, the server's) 1 s, `idle` none.
    write_proc(tmp_path, [pid_stat(10, "vllm", 1, 10, 1 * HZ, 0), pid_stat(11, "engine", 10, 10, 1 * HZ, 0),
                          pid_stat(30, "stress", 1, 30, HZ, 0), pid_stat(31, "idle", 1, 31, 0, 1)], 10, 890)
    probe.window_closed()
    env = probe.environment()
    cpu = env.cpu
    assert cpu.load_avg_1m == 1.5 and cpu.load_avg_5m == 0.75
    assert cpu.server_cpu_s == 2.0
    assert cpu.other_cpu_s_server_cpus == 1.0 and cpu.other_cpu_s_planner_cpus == 0.0
    assert cpu.other_share_server_cpus > 1.0 / (10 * window_s)  # the sleep measured a little more than 50 ms
    assert cpu.steal_share == pytest.approx(10 / 100)
    assert [(p.name, p.pid, p.on) for p in cpu.busiest] == [("stress", 30, ["server"])]
    reasons = disturbances(env, Interference())
    assert len(reasons) == 1 and "of the server's CPUs" in reasons[0] and "stress (pid 30, 1.0 s)" in reasons[0]
    assert disturbances(env, Interference(allow=True)) == []
    assert disturbances(env, Interference(cpu_share=1e9)) == []


def test_other_time_is_capped_by_what_the_servers_cpus_were_busy(tmp_path: Path):
    """A process counts for the CPU it last ran on; one that moved between CPUs cannot add more
    than those CPUs were busy, less the server's own time."""
    def stat_text(busy0: int) -> str:
        return f"cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 {busy0} 0 0 1000 0 0 0 0 0 0\ncpu1 0 0 0 1000 0 0 0 0 0 0\n"

    write_proc(tmp_path, [pid_stat(10, "vllm", 1, 10, 0, 0), pid_stat(30, "mover", 1, 30, 0, 0)], 0, 800)
    (tmp_path / "stat").write_text(stat_text(0))
    probe = CpuProbe(lambda: {10}, server_cpus=[0], planner_cpus=[1], proc=tmp_path, background=False)
    probe.window_opened()
    # CPU 0 was busy 1.5 s: the server 1 s of it, so `mover` (2 s, mostly on CPU 1) had 0.5 s there.
    write_proc(tmp_path, [pid_stat(10, "vllm", 1, 10, HZ, 0), pid_stat(30, "mover", 1, 30, 2 * HZ, 0)], 0, 800)
    (tmp_path / "stat").write_text(stat_text(int(1.5 * HZ)))
    probe.window_closed()
    assert probe.environment().cpu.other_cpu_s_server_cpus == 0.5


def test_an_unknown_server_is_said_and_nothing_is_attributed(tmp_path: Path):
    write_proc(tmp_path, [pid_stat(30, "stress", 1, 30, 0, 0)], 0, 800)
    probe = CpuProbe(None, proc=tmp_path, background=False)
    probe.window_opened()
    probe.window_closed()
    env = probe.environment()
    assert env.cpu.other_share_server_cpus is None
    assert any("server's processes are not known" in n for n in env.unreadable)
    assert disturbances(env, Interference()) == []


def test_no_proc_is_said():
    env = CpuProbe(lambda: {1}, proc=Path("/nonexistent-proc")).environment()
    assert env.cpu is None and "Linux only" in env.unreadable[0]


@pytest.mark.timeout(30)
def test_a_real_busy_process_pinned_to_the_servers_cpu_is_seen():
    cpu = sorted(os.sched_getaffinity(0))[0]
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    # A session of its own: not one of the planner's helpers.
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"], start_new_session=True
    )
    try:
        time.sleep(0.3)
        probe = CpuProbe(lambda: {server.pid}, server_cpus=[cpu], planner_cpus=[cpu])
        probe.window_opened()
        time.sleep(1.0)
        probe.window_closed()
        env = probe.environment()
    finally:
        hog.kill()
        server.kill()
        hog.wait()
        server.wait()
    assert env.cpu.other_share_server_cpus > 0.10
    assert hog.pid in [p.pid for p in env.cpu.busiest]
    assert disturbances(env, Interference())


def test_gpu_rules_flag_a_foreign_process_and_throttling():
    env = StepEnvironment(gpu=GpuEnvironment(
        gpus={"0": GpuState(samples=10, throttled_share=0.5, throttle_reasons=["sw_thermal_slowdown"])},
        foreign_processes=[GpuProcess(gpu="0", pid=99, name="python3", used_mib=1000)],
    ))
    reasons = disturbances(env, Interference())
    assert any("python3 (pid 99) on GPU 0" in r for r in reasons)
    assert any("throttled for 50% of the window" in r and "sw_thermal_slowdown" in r for r in reasons)
    assert disturbances(env, Interference(foreign_gpu_process=False, throttle_share=0.6)) == []


def test_the_power_cap_disturbs_only_when_asked():
    env = StepEnvironment(gpu=GpuEnvironment(gpus={"0": GpuState(
        samples=10, throttled_share=0.0, power_capped_share=0.9, throttle_reasons=["sw_power_cap"],
    )}))
    assert disturbances(env, Interference()) == []
    assert disturbances(env, Interference(power_cap=True)) == [
        "GPU 0 was throttled for 90% of the window (more than 10%): sw_power_cap"
    ]


def test_environment_parts_merge():
    cpu = StepEnvironment(cpu=CpuEnvironment(busiest=[ProcessUse(pid=1, name="x", cpu_s=1.0)]), unreadable=["a"])
    gpu = StepEnvironment(gpu=GpuEnvironment(), unreadable=["b", "a"])
    merged = env_mod.merge([cpu, gpu])
    assert merged.cpu is not None and merged.gpu is not None and merged.unreadable == ["a", "b"]


def test_a_disturbed_step_is_measured_again_then_the_search_stops():
    first = next_probe([Probe(8, "disturbed")], start=8)
    assert first == 8
    history = [Probe(8, "disturbed"), Probe(8, "disturbed")]
    assert next_probe(history, start=8, disturbed_retries=2) == 8
    history.append(Probe(8, "disturbed"))
    assert next_probe(history, start=8, disturbed_retries=2) is None
    assert disturbed(history) == [8] and unresolved(history) == []


def test_the_knee_never_rests_on_a_disturbed_step():
    # A disturbed pass above the lowest failure, or a disturbed failure below a pass: neither counts.
    verdicts = [(4, "pass"), (8, "disturbed"), (6, "fail"), (5, "pass")]
    assert knee_interval(verdicts) == [5, 6]
    history = [Probe(4, "pass"), Probe(8, "disturbed"), Probe(6, "fail")]
    assert next_probe(history, start=4) == 5


def test_the_knee_read_from_every_step_and_the_spread_leave_disturbed_steps_out():
    # Issue 35's fit and between-step spread count every informative step; a disturbed one is not.
    from replay.search import pass_fit
    from replay.stats.across_steps import spread_of
    from tests.unit.test_sweep_outcome import step

    clean = [step(4, True, 1.0), step(6, False, 1.0)]
    disturbed_fail = step(5, False, 1.0).model_copy(update={"disturbed": ["other processes used 40%"]})
    assert pass_fit.trials([*clean, disturbed_fail]) == pass_fit.trials(clean) == [(4, "pass"), (6, "fail")]
    slo = {"tpot_p90_ms": 30.0}
    with_noise = [s.model_copy(update={"tpot_ms": s.tpot_ms.model_copy(update={"p90": 10.0})}) for s in clean]
    noisy = disturbed_fail.model_copy(update={"tpot_ms": disturbed_fail.tpot_ms.model_copy(update={"p90": 90.0})})
    assert spread_of([*with_noise, noisy], slo) == spread_of(with_noise, slo)
