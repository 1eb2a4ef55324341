"""nvidia-smi's clocks, throttle reasons, temperature, power and compute processes, parsed and
judged. The fixtures are written in the format nvidia-smi prints for these queries
(--format=csv,noheader,nounits); they were not recorded on a GPU of this project's."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planner.gpu_health import (
    GpuHealthSampler, foreign_processes, gpu_states, parse_compute_apps, parse_health, throttle_reasons,
)
from replay.step.environment import Interference, disturbances

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia_smi"
UUID0 = "GPU-6a1f0e2c-1d7b-4b7e-9d0a-2f3c4b5a6d7e"
UUID1 = "GPU-0b2c3d4e-5f60-4718-8293-a4b5c6d7e8f9"


def test_throttle_bits_name_only_the_reasons_that_slow_a_gpu_down():
    assert throttle_reasons("0x0000000000000000") == ()
    assert throttle_reasons("0x0000000000000001") == ()  # idle
    assert throttle_reasons("0x0000000000000004") == ("sw_power_cap",)
    assert throttle_reasons("0x0000000000000060") == ("sw_thermal_slowdown", "hw_thermal_slowdown")
    assert throttle_reasons("[Not Supported]") is None


def test_health_rows_are_parsed():
    rows = parse_health((FIXTURES / "health-power-capped.csv").read_text(), t_s=1.0)
    assert [(r.index, r.uuid, r.sm_clock_mhz, r.sm_clock_max_mhz, r.throttle_reasons, r.temperature_c, r.power_draw_w)
            for r in rows] == [
        ("0", UUID0, 1980.0, 1980.0, (), 54.0, 412.37),
        ("1", UUID1, 1410.0, 1980.0, ("sw_power_cap",), 71.0, 699.12),
    ]
    idle = parse_health((FIXTURES / "health-thermal.csv").read_text())
    assert idle[0].power_draw_w is None and idle[0].throttle_reasons == ()


def test_gpu_states_over_a_window():
    rows = parse_health((FIXTURES / "health-power-capped.csv").read_text()) + parse_health(
        (FIXTURES / "health-thermal.csv").read_text()
    )
    states = gpu_states(rows)
    assert states["0"].throttled_share == 0.0 and states["0"].power_draw_w_max == 412.37
    one = states["1"]
    # One sample power-capped, the other thermally throttled: only the second is a slowdown.
    assert one.samples == 2 and one.throttled_share == 0.5 and one.power_capped_share == 0.5
    assert one.throttle_reasons == ["hw_thermal_slowdown", "sw_power_cap", "sw_thermal_slowdown"]
    assert one.sm_clock_mhz_min == 1200.0 and one.sm_clock_mhz_mean == 1305.0 and one.sm_clock_max_mhz == 1980.0
    assert one.temperature_c_max == 91.0


def test_compute_apps_and_the_foreign_one():
    apps = parse_compute_apps((FIXTURES / "compute-apps-foreign.csv").read_text() + "No running processes found\n")
    assert [(a.gpu_uuid, a.pid, a.name, a.used_mib) for a in apps][-1] == (UUID1, 9001, "./burn, gpu", 1024.0)
    index = {UUID0: "0", UUID1: "1"}
    foreign, unknown = foreign_processes(apps, index, server={4242}, here={4242, 9001})
    assert [(p.gpu, p.pid, p.name) for p in foreign] == [("1", 9001, "./burn, gpu")] and unknown == []
    # pids that are not this machine's (a container seeing the host's): not called foreign.
    foreign, unknown = foreign_processes(apps, index, server={1}, here={1})
    assert foreign == [] and unknown == [4242, 4242, 9001]
    # A process on a GPU outside the point's is none of its business.
    assert foreign_processes(apps, {UUID0: "0"}, server={4242}, here={4242, 9001}) == ([], [])


FAKE_SMI = textwrap.dedent('''
    import sys
    args = " ".join(sys.argv[1:])
    if "clocks_event_reasons" in args:
        print("Field \\"clocks_event_reasons.active\\" is not a valid field to query.", file=sys.stderr)
        sys.exit(2)
    if "--query-compute-apps" in args:
        print(open(sys.argv[0].replace("smi.py", "apps.csv")).read(), end="")
    else:
        print(open(sys.argv[0].replace("smi.py", "health.csv")).read(), end="")
''')


@pytest.mark.timeout(30)
def test_the_sampler_is_the_steps_gpu_probe(tmp_path: Path):
    """An older driver (no clocks_event_reasons): the sampler falls back on the throttle name; the
    server's own process is not foreign, another process is; throttling disturbs the step."""
    # Not a descendant of this process (the server here): started by a child that exits at once.
    spawn = "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    other_pid = int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True).stdout)
    try:
        (tmp_path / "smi.py").write_text(FAKE_SMI)
        (tmp_path / "health.csv").write_text((FIXTURES / "health-thermal.csv").read_text())
        (tmp_path / "apps.csv").write_text(f"{UUID0}, {os.getpid()}, python3, 60210\n{UUID1}, {other_pid}, burn, 1024\n")

        async def go():
            sampler = GpuHealthSampler(["0", "1"], server_pids=lambda: {os.getpid()}, interval_s=0.05,
                                       nvidia_smi=[sys.executable, str(tmp_path / "smi.py")])
            async with sampler:
                sampler.window_opened()
                await asyncio.sleep(0.5)
                sampler.window_closed()
            return sampler

        sampler = asyncio.run(go())
        env = sampler.environment()
    finally:
        os.kill(other_pid, signal.SIGKILL)
    assert sampler.peak_mib == {"0": 61234.0, "1": 60871.0}
    assert [(p.gpu, p.pid) for p in env.gpu.foreign_processes] == [("1", other_pid)]
    assert env.gpu.gpus["1"].throttled_share == 1.0 and env.gpu.gpus["0"].throttled_share == 0.0
    reasons = disturbances(env, Interference())
    assert any("another compute process" in r for r in reasons)
    assert any(r.startswith("GPU 1 was throttled for 100% of the window") for r in reasons)


def test_a_local_servers_gpus_are_those_its_processes_compute_on(tmp_path: Path):
    from planner.gpu_health import server_gpus
    from planner.gpus import Gpu

    (tmp_path / "smi.py").write_text(FAKE_SMI)
    (tmp_path / "health.csv").write_text("")
    gpus = [Gpu(index="0", uuid=UUID0, name="H100", memory_total_mib=81559), Gpu(index="1", uuid=UUID1, name="H100", memory_total_mib=81559)]
    smi = [sys.executable, str(tmp_path / "smi.py")]
    # The server (this process) computes on GPU 1; another process on GPU 0 is not the server's.
    (tmp_path / "apps.csv").write_text(f"{UUID0}, 1, burn, 1024\n{UUID1}, {os.getpid()}, python3, 60210\n")
    assert server_gpus({os.getpid()}, gpus, nvidia_smi=smi) == (["1"], None)
    # None of the server's processes listed: every GPU is watched, and the note says why.
    ids, note = server_gpus({999999999}, gpus, nvidia_smi=smi)
    assert ids == ["0", "1"] and "every GPU here is watched" in note
    assert server_gpus({os.getpid()}, [], nvidia_smi=smi)[0] == []
