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
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ray.cluster_utils import Cluster  # noqa: E402

from planner.cli import main  # noqa: E402
from planner.sweep.results import SweepResults  # noqa: E402

FAKE_VLLM = ROOT / "tests" / "fakes" / "fake_vllm.py"


def write_config(folder: Path, *, executor: str, address: str, tp: list[int], kv: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}: " + "how many GPUs " * 6, "max_tokens": 6}) + "\n"
                for i in range(60))
    )
    # Locally the fake sees no CUDA_VISIBLE_DEVICES, so it is told how many GPUs a TP point has.
    gpus = ', FAKE_VLLM_GPUS = "8"' if executor == "local" else ""
    cfg = folder / "sweep.toml"
    cfg.write_text(f"""
prompts = "{corpus}"
[server]
command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_VLLM))}]
model = "bench-{executor}"
env = {{ FAKE_VLLM_ITL_S = "0.015", FAKE_VLLM_ITL_GROWTH = "1.0", FAKE_VLLM_TTFT_S = "0.005"{gpus} }}
startup_timeout_s = 60
stop_grace_s = 5
[grid]
max_model_len = [2048]
tensor_parallel_size = {json.dumps(tp)}
[grid.extra]
kv_cache_memory_bytes = {json.dumps(kv)}
[replay]
start_concurrency = 2
min_requests = 20
max_window_s = 60
request_timeout_s = 30
[slo]
tpot_p50_ms = 52
error_rate = 0
headroom = 0.5
[gpus]
devices = "none"
[executor]
kind = "{executor}"
address = "{address}"
""")
    return cfg


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
            ray_wall, on_ray = timed_sweep(
                write_config(tmp_path / "ray", executor="ray", address=cluster.address, tp=tp, kv=kv), tmp_path / "ray-out"
            )
            local_wall, local = timed_sweep(
                write_config(tmp_path / "local", executor="local", address="auto", tp=tp, kv=kv), tmp_path / "local-out"
            )
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
