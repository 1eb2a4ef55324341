"""Whole sweeps against the fake vLLM program, whose latency grows with concurrency so the search
has a known answer (see tests/fakes/fake_vllm.py): ITL = itl_s x (1 + growth x running)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from planner.cli import main
from planner.export.provenance import load_point
from planner.sweep.config import load_settings
from planner.sweep.grid import expand, fingerprint
from planner.sweep.results import SweepResults
from planner.sweep.run import previous_results
from tests.fakes.sweep_files import ROOT, write_corpus, write_sweep_config
from tests.integration.stopping import signal_and_wait


def write_config(tmp_path: Path, *, kv_bytes: list[str], extra_env: dict | None = None, grid_env: dict | None = None) -> Path:
    """A sweep of the fake vLLM over kv_bytes. ITL at concurrency C is about 40 ms x (1 + 0.5 C):
    120 ms at 4, 140 at 5, 160 at 6. TPOT (a request's mean gap) is the SLO: a starved server
    sends tokens in bursts, which skews a median gap."""
    return write_sweep_config(
        tmp_path,
        corpus=write_corpus(tmp_path / "corpus.jsonl"),
        env={"FAKE_VLLM_ITL_S": "0.04", "FAKE_VLLM_ITL_GROWTH": "0.5", "FAKE_VLLM_TTFT_S": "0.005", **(extra_env or {})},
        grid={"max_model_len": [2048]},
        extra={"kv_cache_memory_bytes": kv_bytes},
        replay={"start_concurrency": 4, "min_requests": 30, "max_window_s": 60, "request_timeout_s": 30},
        slo={"tpot_p50_ms": 150, "error_rate": 0, "max_preemptions": 0, "headroom": 0.2},
        more={"grid.env": grid_env or {}},
    )


def fake_vllm_processes(cfg: Path) -> list[str]:
    """fake vLLM processes of this config's sweep (other tests may run their own beside them)."""
    model = tomllib.loads(cfg.read_text())["server"]["model"]
    out = subprocess.run(["pgrep", "-af", "fake_vllm.py"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if model in line and "pgrep" not in line]


@pytest.mark.timeout(300)
def test_sweep_finds_the_known_answer_and_classifies_the_infeasible_point(tmp_path, capsys):
    cfg = write_config(tmp_path, kv_bytes=["64K", "4M"])
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    results = SweepResults.model_validate_json((out / "sweep.json").read_text())
    small, big = results.points

    assert small.status == "infeasible"
    assert small.failure.kind == "kv_too_small"
    # 64 KiB / 256 B per token = 256 tokens = 2 blocks of 128; minus the null block: 1 block.
    assert small.failure.estimated_max_model_len == 128

    assert big.status == "ok"
    # 4 MiB / 256 B = 16384 tokens = 128 blocks; vLLM reports (128 - 1) blocks... as the fake does.
    assert big.capacity.kv_cache_tokens and big.capacity.block_size == 128
    assert big.mean_blocks_per_request == 1.0
    assert big.concurrency_upper_bound >= 100
    assert big.max_passing_concurrency == 5
    assert big.min_failing_concurrency == 6
    assert big.binding_constraint == "tpot_p50_ms"
    assert big.safe_concurrency == 4  # floor(5 x 0.8)
    assert big.safe_concurrency_per_gpu == 4
    assert big.output_tokens_per_s_per_gpu > 0
    # TPOT p50 against 150 ms read 0.8 of the bound at 4 and 1.33 at 8: the line between them
    # crosses at 5.5, so 5, then one step above it, 6; 5 is measured again (confirmed) before the
    # point ends.
    assert [int(s.load.value) for s in big.steps] == [4, 8, 5, 6, 5]
    assert big.confirmed and big.knee_interval == [5, 6]
    assert all(s.server.metrics_available for s in big.steps)
    assert (out / "points" / big.id / "server.log").exists()

    assert results.best.point_id == big.id
    assert "kv_too_small" in results.best.others[small.id]
    # Measured once more on a fresh server at the safe concurrency, it held.
    assert results.fresh_server.point_id == big.id and results.fresh_server.concurrency == 4
    assert results.fresh_server.held is True and results.fresh_server.searched_again is None
    printed = capsys.readouterr().out
    assert "recommended: " + big.id in printed
    # The machine was looked at before the first server started.
    assert printed.startswith("the machine is ")
    assert fake_vllm_processes(cfg) == []

    # What it measured is recorded beside the settings.
    identity = results.identity
    assert identity.server_flags == ["--enforce-eager"] and identity.server_env["FAKE_VLLM_ITL_GROWTH"] == "0.5"
    assert identity.hardware.kind in ("cpu", "gpu") and identity.slo == {"tpot_p50_ms": 150, "error_rate": 0, "max_preemptions": 0}
    assert identity.vllm_version == big.vllm_version and identity.corpus_sha256 == results.run.corpus.sha256
    # --baseline compares at the end: here the same results again (--resume reuses every point).
    shutil.copytree(out, tmp_path / "baseline")
    args = ["--output", str(out), "--resume", "--baseline", str(tmp_path / "baseline"), "--fail-on", "regression"]
    assert main(["sweep", "--config", str(cfg), *args]) == 0
    printed = capsys.readouterr().out
    assert f"{tmp_path / 'baseline' / 'sweep.json'} -> {out / 'sweep.json'}: UNCHANGED" in printed
    assert "changed: corpus unchanged" in printed
    compared = json.loads((out / "compare.json").read_text())
    assert [p["verdict"] for p in compared["points"]] == ["unchanged", "unchanged"]


@pytest.mark.timeout(300)
def test_server_killed_mid_step_fails_the_point_and_the_sweep_goes_on(tmp_path):
    cfg = write_config(
        tmp_path,
        kv_bytes=["4M"],
        # Dies in the second step (c=8): the first (c=4) takes 4 warm-up + 30 measured requests.
        grid_env={"FAKE_VLLM_DIE_AFTER_REQUESTS": ["45", "0"]},
    )
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    results = SweepResults.model_validate_json((out / "sweep.json").read_text())
    died, survived = results.points
    assert died.config["env"] == {"FAKE_VLLM_DIE_AFTER_REQUESTS": "45"}
    assert died.status == "failed" and died.failure.kind == "server_died"
    assert died.failure.log_tail
    # What was measured before the server died is kept; the step it died in is dropped.
    assert [int(s.load.value) for s in died.steps] == [4]
    assert died.max_passing_concurrency == 4
    assert survived.status == "ok" and survived.max_passing_concurrency == 5
    assert results.best.point_id == survived.id
    assert fake_vllm_processes(cfg) == []


def interrupt_sweep_mid_point(tmp_path: Path, sig: signal.Signals) -> tuple[Path, Path, int, str]:
    """Starts a three-point sweep, sends `sig` once the second point has measured a step; returns
    (config, output folder, exit status, stderr)."""
    cfg = write_config(tmp_path, kv_bytes=["64K", "4M", "8M"])
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner", "sweep", "--config", str(cfg), "--output", str(out)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            data = json.loads((out / "sweep.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            data = None
        if data and len(data["points"]) == 3 and data["points"][1]["steps"]:
            break
        time.sleep(0.2)
    err = signal_and_wait(proc, sig)
    return cfg, out, proc.returncode, err


def assert_interrupted_mid_second_point(out: Path) -> SweepResults:
    interrupted = SweepResults.model_validate_json((out / "sweep.json").read_text())
    assert interrupted.interrupted
    assert interrupted.points[0].status == "infeasible"
    assert interrupted.points[1].status == "failed" and interrupted.points[1].failure.kind == "interrupted"
    assert interrupted.points[1].steps, "what was measured before the interrupt is kept"
    assert interrupted.points[2].status == "pending"
    return interrupted


@pytest.mark.timeout(300)
def test_sigterm_ends_a_sweep_as_ctrl_c_does(tmp_path):
    # As `timeout`, systemd, Kubernetes and CI runners stop a process.
    cfg, out, status, err = interrupt_sweep_mid_point(tmp_path, signal.SIGTERM)
    assert status == 143
    # Progress lines go to stderr too; the stop itself is one line at the end, with no traceback.
    assert err.splitlines()[-1] == "planner sweep: terminated (SIGTERM); results measured so far are kept"
    assert "Traceback" not in err and "Error" not in err
    assert fake_vllm_processes(cfg) == []
    assert_interrupted_mid_second_point(out)


@pytest.mark.timeout(300)
def test_interrupted_sweep_keeps_finished_points_and_resume_reruns_only_the_rest(tmp_path):
    cfg, out, status, err = interrupt_sweep_mid_point(tmp_path, signal.SIGINT)
    assert status == 130
    assert err.splitlines()[-1] == "planner sweep: interrupted; results measured so far are kept"
    assert "Traceback" not in err and "Error" not in err
    assert fake_vllm_processes(cfg) == []
    interrupted = assert_interrupted_mid_second_point(out)

    assert main(["sweep", "--config", str(cfg), "--output", str(out), "--resume"]) == 0
    resumed = SweepResults.model_validate_json((out / "sweep.json").read_text())
    assert resumed.points[0].model_dump() == interrupted.points[0].model_dump()  # reused, not rerun
    assert [p.status for p in resumed.points] == ["infeasible", "ok", "ok"]

    # A changed SLO changes every fingerprint: nothing is reused (asked as --resume asks it).
    def reusable_ids() -> list[str]:
        settings = load_settings(cfg, {})
        earlier = previous_results(out)
        run = resumed.run
        return [
            p.id
            for p in expand(settings)
            if fingerprint(settings, p, corpus_sha256=run.corpus.sha256, vllm_version=run.vllm_version) in earlier
        ]

    assert reusable_ids() == [p.id for p in resumed.points]
    cfg.write_text(cfg.read_text().replace("tpot_p50_ms = 150", "tpot_p50_ms = 170"))
    assert reusable_ids() == []


@pytest.mark.timeout(300)
def test_sigkilled_server_fails_its_point_and_the_next_point_runs(tmp_path):
    cfg = write_config(tmp_path, kv_bytes=["4M", "8M"])
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner", "sweep", "--config", str(cfg), "--output", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            first = json.loads((out / "sweep.json").read_text())["points"][0]
        except (FileNotFoundError, json.JSONDecodeError, IndexError, KeyError):
            first = None
        if first and first["status"] == "running" and first["steps"]:
            break
        time.sleep(0.2)
    model = tomllib.loads(cfg.read_text())["server"]["model"]
    pids = subprocess.run(["pgrep", "-f", f"fake_vllm.py --model {model}"], capture_output=True, text=True).stdout.split()
    assert pids, "the first point's server is not running"
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    assert proc.wait(timeout=180) == 0
    results = SweepResults.model_validate_json((out / "sweep.json").read_text())
    killed, survivor = results.points
    assert killed.status == "failed" and killed.failure.kind == "server_died"
    assert killed.failure.exit_code == -signal.SIGKILL
    assert killed.steps, "the steps finished before the kill are kept"
    assert survivor.status == "ok" and survivor.max_passing_concurrency == 5
    assert fake_vllm_processes(cfg) == []


@pytest.mark.timeout(120)
def test_a_point_across_nodes_is_refused_by_a_local_sweep_without_a_launch(tmp_path):
    cfg = write_config(tmp_path, kv_bytes=["4M"])
    cfg.write_text(cfg.read_text().replace("[grid.extra]\n", "[grid.extra]\nnnodes = [2]\n").replace(
        "max_model_len = [2048]", "max_model_len = [2048]\ntensor_parallel_size = [2]"))
    out = tmp_path / "out"
    code = main(["sweep", "--config", str(cfg), "--output", str(out)])
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "infeasible" and point.failure.kind == "not_enough_gpus"
    assert point.failure.message == (
        "the point spreads vLLM over 2 nodes (nnodes = 2) and a local sweep has one machine; run it on a Ray"
        ' cluster ([executor] kind = "ray", or --executor ray)'
    )
    assert point.command == [] and not (out / "points").exists()
    assert code == 0, "the sweep ran; its verdict is that no configuration passed"


def starts_config(tmp_path, starts, *, slower: str, sweep: dict):
    """A point whose fake server counts its starts in `starts` and runs ITL slower on the starts
    `slower` names (FAKE_VLLM_SLOWER_FROM_START): at its own speed it answers 5 against TPOT p50
    150 ms (about 140 ms there), at 1.3x it answers 3."""
    return write_sweep_config(
        tmp_path,
        corpus=write_corpus(tmp_path / "corpus.jsonl"),
        env={
            "FAKE_VLLM_ITL_S": "0.04", "FAKE_VLLM_ITL_GROWTH": "0.5", "FAKE_VLLM_TTFT_S": "0.005",
            "FAKE_VLLM_STARTS_FILE": str(starts), "FAKE_VLLM_SLOWER_FROM_START": slower,
        },
        grid={"max_model_len": [2048]},
        extra={"kv_cache_memory_bytes": ["4M"]},
        replay={"start_concurrency": 4, "min_requests": 30, "max_window_s": 60, "request_timeout_s": 30},
        slo={"tpot_p50_ms": 150, "error_rate": 0, "max_preemptions": 0, "headroom": 0.2},
        more={"sweep": {**sweep, "confirm_fresh_server": False}},
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_a_point_searched_on_two_server_starts_answers_what_holds_on_both(tmp_path, capsys):
    # [sweep] server_starts = 2, and the second start is slower (ITL x 1.3): the first start
    # answers 5 (TPOT p50 about 140 ms against 150), the second fails 5 (182 ms) and goes on below
    # it from the pooled steps to its own knee, 3 (52 ms x 2.5 = 130 ms; 4 reads 156 ms).
    starts = tmp_path / "starts"
    cfg = starts_config(tmp_path, starts, slower="2:1.3", sweep={"server_starts": 2})
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    assert len(starts.read_text().splitlines()) == 2
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "ok"
    first = [int(s.load.value) for s in point.steps if s.server_start == 1]
    second = [s for s in point.steps if s.server_start == 2]
    assert first and second and len(first) + len(second) == len(point.steps)
    assert max(c for c, s in zip(first, point.steps) if s.slo_pass) == 5
    # The second start measured the first's answer first, failed it, and confirmed its own knee.
    assert int(second[0].load.value) == 5 and not second[0].slo_pass
    assert [int(s.load.value) for s in second[-2:]] == [3, 3] and all(s.slo_pass for s in second[-2:])
    assert point.max_passing_concurrency == 3 and point.knee_fit == 3 and point.safe_concurrency == 2
    assert (out / "points" / point.id / "server.log").exists()
    assert (out / "points" / point.id / "server-start2.log").exists()
    line = f"{point.id}: server starts: 1 passed up to 5, failed at 6"
    assert line in capsys.readouterr().out
    assert "- Server starts: 1 passed up to 5" in (out / "report.md").read_text()
    assert fake_vllm_processes(cfg) == []


@pytest.mark.timeout(400)
def test_starts_that_disagree_are_settled_by_one_more_start(tmp_path, capsys):
    # [sweep] server_starts = 2 and tie_break_starts = 1; only the second start is slower (ITL x
    # 1.3). The first answers 5, the second 3: two precision steps apart, so a third start
    # searches from 5 on its own steps, passes there, and 5 held on two of three starts.
    starts = tmp_path / "starts"
    cfg = starts_config(tmp_path, starts, slower="2-2:1.3", sweep={"server_starts": 2, "tie_break_starts": 1})
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    assert len(starts.read_text().splitlines()) == 3
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "ok"
    third = [s for s in point.steps if s.server_start == 3]
    assert [(int(s.load.value), s.slo_pass) for s in third] == [(5, True)]
    assert point.start_knees == {1: 5, 2: 3, 3: 5}
    # The pooled fit still reads the slow start's failures; the answer is the majority's.
    assert point.knee_fit == 3 and point.answer_basis == "start_majority"
    assert point.safe_concurrency == 4
    # The pooled bracket: 5 failed on the second start.
    assert point.max_passing_concurrency == 3 and point.min_failing_concurrency == 4
    assert (out / "points" / point.id / "server-start3.log").exists()
    assert "3 passed up to 5, nothing above tried (1 step, knee 5); the answer is what held on 2 of 3: 5" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    assert "- Answer read at: 5, the highest load that held on 2 of 3 server starts" in report
    reread = SweepResults.model_validate_json((out / "sweep.json").read_text())
    assert reread.points[0].start_knees == {1: 5, 2: 3, 3: 5}
    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["start_knees"] for r in rows} == {"1:5 2:3 3:5"} and {r["answer_basis"] for r in rows} == {"start_majority"}
    # Rows go by load; each start's steps keep their count.
    assert sorted(r["server_start"] for r in rows) == sorted(str(s.server_start) for s in point.steps)
    # An export says which load its figures were read at: here the majority of the starts.
    safe = load_point(out).safe_concurrency
    assert safe.value == 4
    assert "floor(the knee that held on most server starts 5 (start 1: 5, start 2: 3, start 3: 5) x (1 - headroom" in safe.source
    assert fake_vllm_processes(cfg) == []


@pytest.mark.timeout(300)
def test_an_answer_that_does_not_hold_on_a_fresh_server_is_searched_again(tmp_path, capsys):
    # From the second start on (the fresh server), ITL doubles: TPOT at the safe 4 is about
    # 80 ms x (1 + 0.5 x 4) = 240 ms against 150, and the new search passes only 1.
    starts = tmp_path / "starts"
    cfg = write_config(
        tmp_path, kv_bytes=["4M"],
        extra_env={"FAKE_VLLM_STARTS_FILE": str(starts), "FAKE_VLLM_SLOWER_FROM_START": "2:2"},
    )
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    results = SweepResults.model_validate_json((out / "sweep.json").read_text())
    (point,) = results.points
    assert point.max_passing_concurrency == 5 and point.safe_concurrency == 4
    check = results.fresh_server
    assert check.point_id == point.id and check.concurrency == 4 and check.held is False
    assert [int(s.load.value) for s in check.steps] == [4] and check.steps[0].slo_violations == ["tpot_p50_ms"]
    again = check.searched_again
    assert again.id == f"{point.id}-fresh" and again.status == "ok" and again.max_passing_concurrency == 1
    assert (out / "points" / point.id / "fresh-server.log").exists() and (out / "points" / again.id / "server.log").exists()
    assert len(starts.read_text().splitlines()) == 3
    line = f"fresh-server confirmation of {point.id}: did NOT hold (4 in flight on a fresh server failed tpot_p50_ms)"
    assert line in capsys.readouterr().out
    assert "- F" + line[1:] in (out / "report.md").read_text()
    assert fake_vllm_processes(cfg) == []
