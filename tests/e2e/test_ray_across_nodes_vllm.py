"""A sweep point across two Ray nodes with real vLLM (the CPU build): rank 0 serves the API on one
node, rank 1 runs headless on the other, and they form one tensor-parallel-2 engine over
torch.distributed. The two "nodes" are ray.cluster_utils nodes on this machine with one declared
GPU each (Ray hands them out; vLLM's CPU build ignores CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import json
import subprocess
import uuid
import warnings
from pathlib import Path

import pytest

from planner.cli import main
from planner.sweep.results import SweepResults
from tests.e2e.support import STARTUP_TIMEOUT_S, TinyModel
from tests.fakes.sweep_files import write_corpus

pytestmark = pytest.mark.e2e

VLLM_CLI = Path(__file__).with_name("vllm_cli.py")
KV_BYTES = 4 * 1024 * 1024
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        c = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "num_gpus": 0, "object_store_memory": 100 * 2**20, "include_dashboard": False},
        )
    try:
        for _ in range(2):
            c.add_node(num_cpus=1, num_gpus=1, object_store_memory=100 * 2**20)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


def vllm_ranks(model: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "vllm_cli.py"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if model in line and "pgrep" not in line]


@pytest.mark.timeout(900)
def test_a_point_across_two_nodes_serves_from_one_engine_of_both(two_nodes, vllm_command, tiny_model: TinyModel, tmp_path):
    # `vllm serve` where it works; with the CPU build, vLLM's CLI through its interpreter.
    command = vllm_command if vllm_command[0] == "vllm" else [vllm_command[0], str(VLLM_CLI), "serve"]
    served = f"tiny-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(
        f"""
prompts = "{write_corpus(tmp_path / 'corpus.jsonl', n=40)}"

[server]
command = {json.dumps(command)}
model = {json.dumps(str(tiny_model.path))}
args = ["--enforce-eager", "--served-model-name", "{served}", "--disable-uvicorn-access-log"]
startup_timeout_s = {STARTUP_TIMEOUT_S}
stop_grace_s = 20

[grid]
max_model_len = [{MAX_MODEL_LEN}]
tensor_parallel_size = [2]
[grid.extra]
kv_cache_memory_bytes = ["{KV_BYTES}"]
nnodes = [2]

[replay]
start_concurrency = 2
max_concurrency = 4
min_requests = 20
max_requests = 40
request_timeout_s = 120

[slo]
error_rate = 0
headroom = 0.5

[gpus]
devices = "none"

[executor]
kind = "ray"
address = "{two_nodes.address}"
"""
    )
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    log = (out / point.log_path).read_text()
    assert point.status == "ok", (point.failure, log[-3000:])

    # One engine over both ranks: vLLM's own lines say so.
    assert "world_size=2, local_world_size=1" in log
    headless = (out / point.ranks[1].log_path).read_text()
    assert "headless multiproc executor" in headless and "TP rank 1" in headless
    assert [r.rank for r in point.ranks] == [0, 1] and len({r.node_id for r in point.ranks}) == 2
    # The pool vLLM reports for the tensor-parallel engine, as the log states it.
    assert point.capacity.kv_cache_tokens and point.capacity.source
    ok = sum(s.requests_ok for s in point.steps)
    assert ok >= 20 and all(s.requests_failed == 0 for s in point.steps)
    assert point.max_passing_concurrency == 4, "no latency SLO: every concurrency up to the cap passes"
    assert vllm_ranks(served) == []
