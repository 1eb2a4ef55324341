"""Wall time of a sweep on a Ray cluster against the same points one after another.

A real Ray cluster on this machine (ray.cluster_utils.Cluster: a head without GPUs and N nodes of
two declared GPUs each) runs a grid of fake vLLM servers (tests/fakes/fake_vllm.py) with the Ray
executor; then the same points run one after another with the local executor on no GPUs. Both
in one run, so the ratio compares like with like on the same (possibly busy) machine. The fake
serves from sleeps, so what is measured is how well the cluster overlaps points, not GPU work.

    python benchmarks/ray_sweep.py [--nodes 2] [--tp 1 2] [--kv 4M 8M]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ray.cluster_utils import Cluster  # noqa: E402

from planner.cli import main  # noqa: E402
from planner.sweep.results import SweepResults  # noqa: E402
from tests.fakes.sweep_files import write_ray_sweep_config  # noqa: E402


def timed_sweep(cfg: Path, out: Path) -> tuple[float, SweepResults]:
    start = time.perf_counter()
    # The progress display and tables go to stderr/stdout; only the figures matter here.
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    wall = time.perf_counter() - start
    return wall, SweepResults.model_validate_json((out / "sweep.json").read_text())


def run(nodes: int, tp: list[int], kv: list[str]) -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "object_store_memory": 100 * 2**20, "include_dashboard": False},
    )
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=2, num_gpus=2, object_store_memory=100 * 2**20)
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory(prefix="ray-sweep-bench-") as tmp:
            tmp_path = Path(tmp)
            on_cluster = write_ray_sweep_config(
                tmp_path / "ray", tp=tp, kv_bytes=kv, address=cluster.address, startup_timeout_s=60
            )
            # Locally the fake sees no CUDA_VISIBLE_DEVICES, so it is told how many GPUs a TP point has.
            one_by_one = write_ray_sweep_config(
                tmp_path / "local", tp=tp, kv_bytes=kv, executor="local", env={"FAKE_VLLM_GPUS": "8"}, startup_timeout_s=60
            )
            ray_wall, on_ray = timed_sweep(on_cluster, tmp_path / "ray-out")
            local_wall, local = timed_sweep(one_by_one, tmp_path / "local-out")
    finally:
        cluster.shutdown()
    print(f"{len(on_ray.points)} points (tp {tp} x kv {kv}) on {nodes} Ray nodes of 2 GPUs vs one after another")
    print(f"{'':24}{'wall s':>8}  {'sum of point durations s':>26}  statuses")
    for name, wall, res in (("ray cluster", ray_wall, on_ray), ("one after another", local_wall, local)):
        durations = sum(p.duration_s or 0 for p in res.points)
        print(f"{name:24}{wall:8.1f}  {durations:26.1f}  {','.join(p.status for p in res.points)}")
    print(f"speed-up (one after another / ray): {local_wall / ray_wall:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kv", nargs="+", default=["4M", "8M"])
    args = parser.parse_args()
    run(args.nodes, args.tp, args.kv)
