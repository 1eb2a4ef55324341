"""Sweeps on a real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster): a head
without GPUs and two nodes of two declared GPUs each. Ray hands declared GPUs out and sets
CUDA_VISIBLE_DEVICES per task without any GPU present, and the fake vLLM counts the GPUs it can
see from that variable, so a tensor-parallel-2 point starts only if Ray gave it two.

The fake's latency has a known answer (tests/fakes/fake_vllm.py): ITL = 15 ms x (1 + C) at
concurrency C, so a TPOT SLO of 52 ms passes at 2 (45 ms) and fails at 3 (60 ms).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

# Ray is the optional extra .[ray]; `make test` installs it.
from ray.cluster_utils import Cluster

from planner.cli import main
from planner.exporter import PlannerMetrics
from planner.ports import free_port
from planner.report import write_report
from planner.sweep.config import load_settings
from planner.sweep.results import SweepResults
from planner.sweep.run import run_sweep
from replay.corpus.jsonl import load_corpus
from tests.fakes.results import value
from tests.fakes.sweep_files import ROOT
from tests.fakes.sweep_files import write_ray_sweep_config as write_config
from tests.integration.stopping import reap

NODE = {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 100 * 2**20}
# Two GPU models, so results and the report show which point ran on which.
MODELS = ("FAKE-A", "FAKE-B")
MEASURED = (
    "status", "capacity", "concurrency_upper_bound", "mean_blocks_per_request", "max_passing_concurrency",
    "min_failing_concurrency", "safe_concurrency", "safe_concurrency_per_gpu", "binding_constraint", "gpus",
)


def start_cluster() -> Cluster:
    with warnings.catch_warnings():
        # Ray's start of the client server leaves its log files to the garbage collector.
        warnings.simplefilter("ignore", ResourceWarning)
        c = _start_head()
    try:
        for model in MODELS:
            c.add_node(**NODE, resources={f"accelerator_type:{model}": 1})
        c.wait_for_nodes()
    except BaseException:
        c.shutdown()
        raise
    return c


def _start_head() -> Cluster:
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1, "num_gpus": 0, "object_store_memory": 100 * 2**20, "include_dashboard": False,
            # A Ray Client server (ray://) on the head, as `ray start --head` has on port 10001. It
            # asks the head's runtime-env agent for each client's environment, at a port that must
            # be known before the head starts.
            "ray_client_server_port": (client_port := free_port()), "runtime_env_agent_port": free_port(),
        },
    )
    c.client_address = f"ray://{c.address.rpartition(':')[0]}:{client_port}"
    return c


@pytest.fixture(scope="module")
def cluster():
    # A raylet exits when its node's metrics agent has not written its port within a fixed 15 s
    # (Ray issue 65983), which a 2-core machine busy with other tests can take: one more try.
    try:
        c = start_cluster()
    except Exception:
        c = start_cluster()
    yield c
    c.shutdown()


def model_of(cfg: Path) -> str:
    import tomllib

    return tomllib.loads(cfg.read_text())["server"]["model"]


def processes(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def fake_servers(cfg: Path) -> list[str]:
    return [line for line in processes("fake_vllm.py") if model_of(cfg) in line]


def ray_workers() -> set[str]:
    return {line.split()[0] for line in processes("^ray::")}


def start_driver(cfg: Path, out: Path, address: str) -> subprocess.Popen:
    # The kind from the flag and the address from the environment: both ways in are exercised.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PLANNER_EXECUTOR__ADDRESS": address}
    # The driver's output goes to a file beside the results, for the assertion messages.
    with open(cfg.parent / "driver.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "planner", "sweep", "--config", str(cfg), "--output", str(out), "--executor", "ray"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )


def driver_log(cfg: Path) -> str:
    return (cfg.parent / "driver.log").read_text(errors="replace")[-3000:]


def wait_for(out: Path, ready, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data = json.loads((out / "sweep.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            data = None
        if data and ready(data):
            return data
        time.sleep(0.2)
    raise AssertionError(f"sweep.json never got there: {data}")


def running_with_steps(data: dict) -> list[dict]:
    return [p for p in data["points"] if p["status"] == "running" and p["steps"] and p.get("node_id")]


@pytest.mark.timeout(120)
def test_a_point_wider_than_any_node_is_not_enough_gpus_without_a_launch(cluster, tmp_path):
    cfg = write_config(tmp_path, tp=[4], kv_bytes=["4M"], address=cluster.address)
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "infeasible"
    assert point.failure.kind == "not_enough_gpus"
    assert "GPU 4" in point.failure.message
    assert point.failure.message.count(": 2 GPU") == 2, point.failure.message  # both GPU nodes, named
    assert point.command == [] and point.started_at is None
    assert not (out / "points").exists()


@pytest.mark.timeout(420)
def test_points_run_on_both_nodes_on_disjoint_gpus_with_the_local_results(cluster, tmp_path):
    ray_cfg = write_config(tmp_path / "ray", tp=[1, 2], kv_bytes=["4M", "8M"], address=cluster.address)
    # run_sweep itself, so the test holds the exporter the nodes' live events must reach.
    settings = load_settings(ray_cfg)
    metrics = PlannerMetrics()
    on_ray = asyncio.run(
        run_sweep(settings, load_corpus(settings.prompts), output_dir=tmp_path / "ray-out", observers=[metrics])
    )
    write_report(tmp_path / "ray-out")
    assert on_ray == SweepResults.model_validate_json((tmp_path / "ray-out" / "sweep.json").read_text())
    for p in on_ray.points:
        assert value(metrics, "planner_point_node_info", point=p.id, node=p.node_hostname, gpu_model=p.gpu_model) == 1
        steps = {"true": 0.0, "false": 0.0}
        for verdict in steps:
            steps[verdict] = value(metrics, "planner_steps_total", point=p.id, slo_pass=verdict) or 0.0
        # 2 passes, 4 and 3 fail, and 2 passes again on fresh prompts: the knee confirmed.
        assert steps == {"true": 2.0, "false": 2.0}, (p.id, steps)
        assert value(metrics, "planner_requests_total", point=p.id, status="ok") >= 3 * 20
        assert value(metrics, "planner_inflight_requests", point=p.id) == 0
        assert value(metrics, "planner_safe_concurrency_per_gpu", point=p.id) == p.safe_concurrency_per_gpu

    # The same points one after another on this machine; the fake sees two GPUs as the nodes' do.
    local_cfg = write_config(tmp_path / "local", tp=[1, 2], kv_bytes=["4M", "8M"], executor="local", env={"FAKE_VLLM_GPUS": "2"})
    assert main(["sweep", "--config", str(local_cfg), "--output", str(tmp_path / "local-out")]) == 0
    local = SweepResults.model_validate_json((tmp_path / "local-out" / "sweep.json").read_text())

    assert [p.id for p in on_ray.points] == [p.id for p in local.points]
    for r, loc in zip(on_ray.points, local.points):
        assert r.status == "ok", (r.id, r.failure)
        assert {k: getattr(r, k) for k in MEASURED} == {k: getattr(loc, k) for k in MEASURED}, r.id
        assert [int(s.load.value) for s in r.steps] == [int(s.load.value) for s in loc.steps]
        assert r.max_passing_concurrency == 2 and r.min_failing_concurrency == 3
        assert len(r.gpu_ids) == r.gpus and r.gpu_model in MODELS and r.node_hostname
        # The server's log came back from the node.
        assert "Starting vLLM" in (tmp_path / "ray-out" / r.log_path).read_text()
    # Which of two equal points wins is a throughput tie-break, a timing: compare what it won on.
    assert on_ray.best.safe_concurrency_per_gpu == local.best.safe_concurrency_per_gpu == 1
    # The recommended point measured again on a fresh server, as a Ray task on a node; its log came back.
    fresh = on_ray.fresh_server
    assert fresh is not None and fresh.point_id == on_ray.best.point_id and fresh.held is True, fresh
    assert "Starting vLLM" in (tmp_path / "ray-out" / fresh.log_path).read_text()

    assert len({p.node_id for p in on_ray.points}) == 2, "both GPU nodes ran points"

    def span(p):
        start = time.mktime(time.strptime(p.started_at[:19], "%Y-%m-%dT%H:%M:%S"))
        return start, start + p.duration_s

    # started_at has whole seconds, and a point's GPUs go to the next one as soon as it ends:
    # only an overlap longer than that rounding is one.
    overlapping = [
        (a, b) for i, a in enumerate(on_ray.points) for b in on_ray.points[i + 1:]
        if min(span(a)[1], span(b)[1]) - max(span(a)[0], span(b)[0]) > 2.0
    ]
    assert overlapping, "no two points ran at the same time"
    for a, b in overlapping:
        if a.node_id == b.node_id:
            assert not set(a.gpu_ids) & set(b.gpu_ids), (a.id, a.gpu_ids, b.id, b.gpu_ids)

    # Per-GPU figures grouped by GPU model, since the two nodes' models differ.
    report = (tmp_path / "ray-out" / "report.md").read_text()
    for model in {p.gpu_model for p in on_ray.points}:
        assert f"### {model}" in report
    assert fake_servers(ray_cfg) == []


@pytest.mark.timeout(300)
def test_a_ray_client_address_runs_the_sweep_from_outside_the_cluster(cluster, tmp_path, capfd):
    cfg = write_config(tmp_path, tp=[1], kv_bytes=["4M"], address=cluster.client_address)
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "ok", point.failure
    assert point.max_passing_concurrency == 2 and point.min_failing_concurrency == 3
    assert point.node_id and point.gpu_model in MODELS
    assert "Starting vLLM" in (out / point.log_path).read_text()
    # The progress reached the driver through the client connection, and it closed cleanly.
    printed = capfd.readouterr()
    assert "concurrency 3" in printed.err  # the progress display's line
    assert "Traceback" not in printed.err, printed.err[-2000:]
    assert fake_servers(cfg) == []


@pytest.mark.timeout(300)
def test_a_point_across_two_nodes_runs_a_vllm_rank_on_each(cluster, tmp_path):
    cfg = write_config(tmp_path, tp=[2], kv_bytes=["4M"], nnodes=[2])
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "ok", point.failure
    # The same known answer as on one node; per GPU, over both nodes' GPUs.
    assert point.max_passing_concurrency == 2 and point.min_failing_concurrency == 3
    assert point.gpus == 2 and point.safe_concurrency == 1 and point.safe_concurrency_per_gpu == 0.5
    # One rank per GPU node, one GPU each (the fake starts only if it sees tensor x pipeline
    # parallel / nnodes GPUs), rank 0 where the point's own node is.
    assert [r.rank for r in point.ranks] == [0, 1]
    assert len({r.node_id for r in point.ranks}) == 2 and point.ranks[0].node_id == point.node_id
    assert all(len(r.gpu_ids) == 1 and r.gpu_model in MODELS for r in point.ranks)
    assert point.gpu_model == ", ".join(sorted({r.gpu_model for r in point.ranks}))
    command = " ".join(point.command)
    assert "--nnodes 2 --node-rank 0 --master-addr " in command and "--headless" not in command
    assert "All 2 nodes joined" in (out / point.log_path).read_text()
    assert point.ranks[0].log_path == point.log_path
    headless = (out / point.ranks[1].log_path).read_text()
    assert "'headless': True" in headless and "'node_rank': 1" in headless
    # It outlives rank 0 (as vLLM's does): the planner stopped it, with SIGTERM, after rank 0.
    assert "headless multiproc executor" in headless and "[shutdown] Executor" in headless
    assert point.ranks[1].exit_code == 0
    assert fake_servers(cfg) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("taken_starts", [1, 3])
def test_a_master_port_taken_before_rank_0_listens_starts_every_rank_again_on_another(cluster, tmp_path, taken_starts):
    # Another process holds the master port when rank 0's vLLM listens on it: torch's EADDRINUSE.
    starts = tmp_path / "rank-0-starts"
    env = {"FAKE_VLLM_MASTER_PORT_TAKEN": str(starts), "FAKE_VLLM_MASTER_PORT_TAKEN_STARTS": str(taken_starts)}
    cfg = write_config(tmp_path, tp=[2], kv_bytes=["4M"], nnodes=[2], env=env)
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    notes = [n for n in point.notes if n.startswith("master_port_taken:")]
    if taken_starts == 1:
        assert point.status == "ok", point.failure
        assert point.max_passing_concurrency == 2 and point.min_failing_concurrency == 3
        (note,) = notes
        first = int(note.split("master port ")[1].split()[0])
        command = point.command
        assert int(command[command.index("--master-port") + 1]) != first, (note, command)
        assert len(starts.read_text().splitlines()) == 2
    else:
        # Bounded: three starts (PORT_ATTEMPTS), then the point fails naming torch's line.
        assert point.status == "failed" and point.failure.kind == "master_port_taken", point.failure
        assert "failed to listen on any local network address" in point.failure.message
        assert "EADDRINUSE" in point.failure.message and len(notes) == 2
        assert len(starts.read_text().splitlines()) == 3
    time.sleep(1)
    assert fake_servers(cfg) == []


@pytest.mark.timeout(300)
def test_a_rank_whose_vllm_dies_fails_the_point_with_that_ranks_log(cluster, tmp_path):
    trigger = tmp_path / "rank-1-dies"
    cfg = write_config(tmp_path, tp=[2], kv_bytes=["4M"], nnodes=[2], env={"FAKE_VLLM_RANK_DIE_WHEN": str(trigger)})
    out = tmp_path / "out"
    driver = start_driver(cfg, out, cluster.address)
    try:
        # Rank 1 dies once rank 0 has measured a step, so mid-replay.
        wait_for(out, running_with_steps)
        trigger.touch()
        assert driver.wait(timeout=120) == 0, driver_log(cfg)
    finally:
        reap(driver)
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "failed" and point.failure.kind == "server_died", point.failure
    host = point.ranks[1].node_hostname
    # Whichever exit the point saw first, the rank that went first is named, with its log.
    assert point.failure.message.startswith(
        f"vLLM's rank 1 of 2 (node {host}) exited with code 1 during the replay"
    ), point.failure.message
    assert any("VllmWorker-1 died unexpectedly" in line for line in point.failure.log_tail)
    assert "VllmWorker-1 died unexpectedly" in (out / point.ranks[1].log_path).read_text()
    assert point.steps, "the steps measured before are kept"
    time.sleep(1)
    assert fake_servers(cfg) == []


@pytest.mark.timeout(120)
def test_a_point_across_more_nodes_than_have_the_gpus_is_not_enough_gpus(cluster, tmp_path):
    cfg = write_config(tmp_path, tp=[3], kv_bytes=["4M"], nnodes=[3])
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "infeasible" and point.failure.kind == "not_enough_gpus"
    assert "GPU 1, CPU 1 on each of 3 nodes (nnodes = 3" in point.failure.message
    assert point.command == [] and not (out / "points").exists()


def kill_a_running_node(cluster, cfg: Path, out: Path) -> tuple[dict, SweepResults]:
    """Start the sweep, kill the node of a point that has measured a step, let the sweep end."""
    driver = start_driver(cfg, out, cluster.address)
    try:
        data = wait_for(out, running_with_steps)
        victim = running_with_steps(data)[0]
        (node,) = [n for n in cluster.worker_nodes if n.node_id == victim["node_id"]]
        cluster.remove_node(node, allow_graceful=False)
        assert driver.wait(timeout=240) == 0, driver_log(cfg)
    finally:
        reap(driver)
        # The next test gets a cluster of two GPU nodes again.
        cluster.add_node(**NODE, resources={f"accelerator_type:{MODELS[0]}": 1})
        cluster.wait_for_nodes()
    return victim, SweepResults.model_validate_json((out / "sweep.json").read_text())


@pytest.mark.timeout(300)
def test_a_point_whose_node_dies_is_retried_on_the_other_node(cluster, tmp_path):
    cfg = write_config(tmp_path, tp=[2], kv_bytes=["4M", "8M"])
    victim, results = kill_a_running_node(cluster, cfg, tmp_path / "out")
    assert [p.status for p in results.points] == ["ok", "ok"], [p.failure for p in results.points]
    retried = next(p for p in results.points if p.id == victim["id"])
    assert retried.node_id != victim["node_id"]
    # The retry starts over: only its own steps are kept, a whole search from the start. (The
    # known answer is test (a)'s business: this one must not hang on the latency of a busy machine.)
    assert int(retried.steps[0].load.value) == 2
    assert retried.max_passing_concurrency is not None and retried.min_failing_concurrency is not None
    # None of the lost attempt's steps is kept. (Loads may repeat: the search measures its knee
    # again on fresh prompts to confirm it.)
    lost = {(s["started_at"], s["load"]["value"]) for s in victim["steps"]}
    kept = {(s.started_at, s.load.value) for s in retried.steps}
    assert victim["steps"] and not lost & kept, (lost, kept)
    time.sleep(1)
    assert fake_servers(cfg) == []


@pytest.mark.timeout(300)
def test_without_retries_a_lost_node_fails_its_point_and_the_sweep_goes_on(cluster, tmp_path):
    cfg = write_config(tmp_path, tp=[2], kv_bytes=["4M", "8M"], max_retries=0)
    victim, results = kill_a_running_node(cluster, cfg, tmp_path / "out")
    lost = next(p for p in results.points if p.id == victim["id"])
    assert lost.status == "failed" and lost.failure.kind == "node_lost"
    assert "max_retries = 0" in lost.failure.message
    assert lost.steps, "the steps measured before the node died are kept"
    (other,) = [p for p in results.points if p.id != victim["id"]]
    assert other.status == "ok" and other.node_id != victim["node_id"]
    time.sleep(1)
    assert fake_servers(cfg) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("sig", "status", "nnodes"),
    [(signal.SIGINT, 130, 1), (signal.SIGTERM, 143, 1), (signal.SIGINT, 130, 2)],
    ids=["ctrl-c", "sigterm", "ctrl-c-points-across-nodes"],
)
def test_stopping_the_driver_leaves_no_server_and_no_worker_on_any_node(cluster, tmp_path, sig, status, nnodes):
    # Across nodes: two points of one GPU on each GPU node, both running, four vLLM ranks.
    cfg = write_config(tmp_path, tp=[1, 2] if nnodes == 1 else [2], kv_bytes=["4M", "8M"], nnodes=[2] if nnodes == 2 else None)
    out = tmp_path / "out"
    workers_before = ray_workers()
    driver = start_driver(cfg, out, cluster.address)
    try:
        wait_for(out, lambda d: len(running_with_steps(d)) >= 2)
        assert len(fake_servers(cfg)) >= 2 * nnodes, "a rank of a running point is missing"
        driver.send_signal(sig)
        code = driver.wait(timeout=20)
        assert code == status, driver_log(cfg)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (fake_servers(cfg) or ray_workers() - workers_before):
            time.sleep(0.5)
    finally:
        reap(driver)
    assert fake_servers(cfg) == []
    assert ray_workers() - workers_before == set()
    interrupted = SweepResults.model_validate_json((out / "sweep.json").read_text())
    assert interrupted.interrupted
    statuses = [p.status for p in interrupted.points]
    assert statuses.count("failed") >= 2
    assert all(p.failure.kind == "interrupted" for p in interrupted.points if p.status == "failed")
    assert all(p.steps for p in interrupted.points if p.status == "failed"), "what was measured is kept"


@pytest.mark.timeout(300)
def test_a_point_across_nodes_whose_headless_ranks_node_dies_is_rerun(cluster, tmp_path):
    cfg = write_config(tmp_path, tp=[2], kv_bytes=["4M"], nnodes=[2])
    out = tmp_path / "out"
    driver = start_driver(cfg, out, cluster.address)
    try:
        data = wait_for(out, lambda d: [p for p in running_with_steps(d) if len(p["ranks"]) == 2])
        (victim,) = running_with_steps(data)
        lost = victim["ranks"][1]["node_id"]
        (node,) = [n for n in cluster.worker_nodes if n.node_id == lost]
        cluster.remove_node(node, allow_graceful=False)
        # A node for the rerun's second rank (Ray moves the placement group's bundle there).
        cluster.add_node(**NODE, resources={f"accelerator_type:{MODELS[1]}": 1})
        cluster.wait_for_nodes()
        assert driver.wait(timeout=240) == 0, driver_log(cfg)
    finally:
        reap(driver)
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "ok", point.failure
    assert lost not in {r.node_id for r in point.ranks} and len({r.node_id for r in point.ranks}) == 2
    # The rerun starts over: none of the lost attempt's steps is kept.
    assert not {s["started_at"] for s in victim["steps"]} & {s.started_at for s in point.steps}
    assert int(point.steps[0].load.value) == 2
    time.sleep(1)
    assert fake_servers(cfg) == []
