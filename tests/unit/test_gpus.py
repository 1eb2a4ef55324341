"""planner.gpus: nvidia-smi parsing, discovery, placement waves, the memory sampler."""

from __future__ import annotations

import asyncio
import stat
import sys
from pathlib import Path

import pytest

from planner.errors import ConfigError
from planner.gpus import GpuMemorySampler, Placement, discover, parse_nvidia_smi, plan_placement

# `nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits`
# on an 8 x H100 node (one GPU busy).
NVIDIA_SMI_8XH100 = """\
0, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000000, NVIDIA H100 80GB HBM3, 81559, 1
1, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000001, NVIDIA H100 80GB HBM3, 81559, 1
2, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000002, NVIDIA H100 80GB HBM3, 81559, 1
3, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000003, NVIDIA H100 80GB HBM3, 81559, 74213
4, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000004, NVIDIA H100 80GB HBM3, 81559, 1
5, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000005, NVIDIA H100 80GB HBM3, 81559, 1
6, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000006, NVIDIA H100 80GB HBM3, 81559, 1
7, GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000007, NVIDIA H100 80GB HBM3, 81559, 1
"""


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(NVIDIA_SMI_8XH100)
    assert [g.index for g in gpus] == [str(i) for i in range(8)]
    assert gpus[3].name == "NVIDIA H100 80GB HBM3"
    assert (gpus[3].memory_total_mib, gpus[3].memory_used_mib) == (81559, 74213)
    assert gpus[0].uuid == "GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000000"


def test_parse_nvidia_smi_without_uuid_and_with_na_and_a_comma_in_the_name() -> None:
    gpus = parse_nvidia_smi("0, Tesla T4, 15360, [N/A]\n\n1, Odd, Name GPU, 24576, 100\n")
    assert [(g.index, g.name, g.memory_total_mib, g.memory_used_mib, g.uuid) for g in gpus] == [
        ("0", "Tesla T4", 15360, None, None),
        ("1", "Odd, Name GPU", 24576, 100, None),
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("0, H100, 81559\n", "line 1: '0, H100, 81559' has 3 fields"),
        ("0, H100, lots, 1\n", "line 1: 'lots' is not a number of MiB"),
        ("0, H100, 1, 1\n1, H100, [N/A], 1\n", "line 2: GPU 1 reports no memory.total"),
    ],
)
def test_parse_nvidia_smi_rejects_bad_rows(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match="nvidia-smi output ") as info:
        parse_nvidia_smi(text)
    assert words in str(info.value)


def _fake_nvidia_smi(tmp_path: Path, body: str, exit_code: int = 0) -> str:
    # A stand-in executable: prints `body` for any query, ignoring the `-i` filter.
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write({body!r})\n"
        f"sys.stderr.write('NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.\\n' if {exit_code} else '')\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_discover_none_and_auto_without_nvidia_smi() -> None:
    assert discover("none") == []
    assert discover("auto", nvidia_smi="no-such-nvidia-smi-here") == []


def test_discover_auto_and_by_index(tmp_path: Path) -> None:
    smi = _fake_nvidia_smi(tmp_path, NVIDIA_SMI_8XH100)
    assert len(discover("auto", nvidia_smi=smi)) == 8
    chosen = discover(["6", "GPU-5f1c3d0e-aa11-4b2b-9c3d-000000000002"], nvidia_smi=smi)
    assert [g.index for g in chosen] == ["6", "2"]


def test_discover_rejects_unknown_and_repeated_gpus(tmp_path: Path) -> None:
    smi = _fake_nvidia_smi(tmp_path, NVIDIA_SMI_8XH100)
    with pytest.raises(ConfigError, match=r"devices: no GPU 9; the GPUs here are 0, 1, 2, 3, 4, 5, 6, 7"):
        discover(["1", "9"], nvidia_smi=smi)
    with pytest.raises(ConfigError, match="lists a GPU twice"):
        discover(["1", "1"], nvidia_smi=smi)
    with pytest.raises(ConfigError, match="no no-such-smi on PATH"):
        discover(["0"], nvidia_smi="no-such-smi")
    with pytest.raises(ConfigError, match="'gpu0' is not valid"):
        discover("gpu0")  # type: ignore[arg-type]


def test_discover_reports_a_broken_driver(tmp_path: Path) -> None:
    smi = _fake_nvidia_smi(tmp_path, "", exit_code=9)
    with pytest.raises(ConfigError, match=r"nvidia-smi failed \(exit 9\): NVIDIA-SMI has failed"):
        discover("auto", nvidia_smi=smi)


# -- placement -------------------------------------------------------------------------------

EIGHT = [str(i) for i in range(8)]


def _waves(needs: list[int], free: list[str]) -> list[list[tuple[int, tuple[str, ...]]]]:
    return [[(p.point, p.gpu_ids) for p in wave] for wave in plan_placement(needs, free)]


def test_placement_packs_tp_points_into_waves() -> None:
    assert _waves([4, 2, 2, 1, 1, 4, 8], EIGHT) == [
        [(6, tuple(EIGHT))],
        [(0, ("0", "1", "2", "3")), (5, ("4", "5", "6", "7"))],
        [(1, ("0", "1")), (2, ("2", "3")), (3, ("4",)), (4, ("5",))],
    ]


def test_placement_sets_are_disjoint_and_aligned() -> None:
    needs = [1, 2, 1, 4, 2, 1, 1, 2, 8, 1, 4]
    waves = plan_placement(needs, EIGHT)
    placed = sorted(p.point for wave in waves for p in wave)
    assert placed == list(range(len(needs)))
    for wave in waves:
        used = [g for p in wave for g in p.gpu_ids]
        assert len(used) == len(set(used))
        for p in wave:
            assert len(p.gpu_ids) == needs[p.point]
            first = int(p.gpu_ids[0])
            assert first % len(p.gpu_ids) == 0  # tp groups start on an aligned GPU
    # 27 GPU-slots on 8 GPUs cannot take fewer than 4 waves, and first-fit decreasing needs no more.
    assert len(waves) == 4


def test_placement_on_a_subset_of_gpus() -> None:
    assert _waves([2, 1, 1], ["3", "5", "6"]) == [[(0, ("3", "5")), (1, ("6",))], [(2, ("3",))]]


def test_placement_in_cpu_mode_runs_points_one_at_a_time() -> None:
    assert plan_placement([1, 2, 1], []) == [[Placement(0, ())], [Placement(1, ())], [Placement(2, ())]]


def test_placement_rejects_points_that_cannot_fit() -> None:
    with pytest.raises(ConfigError, match=r"point 1 needs 8 GPUs but only 4 are available \(0, 1, 2, 3\)"):
        plan_placement([1, 8], EIGHT[:4])
    with pytest.raises(ConfigError, match="point 0 needs 0 GPUs"):
        plan_placement([0], EIGHT)


# -- memory sampler --------------------------------------------------------------------------


def _counting_nvidia_smi(tmp_path: Path) -> str:
    # Each call reports 1000 MiB more on GPU 0 than the call before, and a flat 500 on GPU 1.
    counter = tmp_path / "calls"
    script = tmp_path / "nvidia-smi-count"
    script.write_text(
        f"#!{sys.executable}\nimport pathlib\np = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\n"
        "print(f'0, {n * 1000}')\nprint('1, 500')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.timeout(30)
def test_sampler_keeps_the_peak_per_gpu(tmp_path: Path) -> None:
    smi = _counting_nvidia_smi(tmp_path)

    async def run() -> GpuMemorySampler:
        async with GpuMemorySampler(["0", "1"], interval_s=0.1, nvidia_smi=[smi]) as sampler:
            await asyncio.sleep(0.5)
        return sampler

    sampler = asyncio.run(run())
    calls = int((tmp_path / "calls").read_text())
    assert calls >= 3
    assert sampler.samples == calls
    assert sampler.peak_mib == {"0": calls * 1000.0, "1": 500.0}
    assert sampler.errors == 0 and sampler.note is None


def test_sampler_without_gpus_records_nothing_and_says_so() -> None:
    async def run() -> GpuMemorySampler:
        async with GpuMemorySampler([]) as sampler:
            await asyncio.sleep(0.01)
        return sampler

    sampler = asyncio.run(run())
    assert (sampler.peak_mib, sampler.samples) == ({}, 0)
    assert sampler.note == "no GPUs: GPU memory not sampled"


@pytest.mark.timeout(30)
def test_sampler_counts_failures_and_goes_on(tmp_path: Path) -> None:
    smi = _fake_nvidia_smi(tmp_path, "", exit_code=9)

    async def run() -> GpuMemorySampler:
        sampler = GpuMemorySampler(["0"], interval_s=0.05, nvidia_smi=[smi])
        await sampler.sample_once()
        await sampler.sample_once()
        return sampler

    sampler = asyncio.run(run())
    assert sampler.errors == 2 and sampler.samples == 0
    assert sampler.note is not None and sampler.note.startswith(f"{smi} exited 9: NVIDIA-SMI has failed")
    missing = asyncio.run(_sample_with(["no-such-nvidia-smi"]))
    assert missing.errors == 1 and missing.note is not None and missing.note.startswith("cannot run no-such-nvidia-smi")


async def _sample_with(command: list[str]) -> GpuMemorySampler:
    sampler = GpuMemorySampler(["0"], nvidia_smi=command)
    await sampler.sample_once()
    return sampler

