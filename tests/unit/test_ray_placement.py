"""What a point holds on a Ray node, and the refusal of points no node can hold (no cluster needed)."""

from __future__ import annotations

from planner.sweep.config import ExecutorSection
from planner.sweep.grid import Point
from planner.sweep.ray_driver import RayExecutor

NODES = [
    {"NodeID": "a" * 56, "Alive": True, "NodeManagerHostname": "gpu-a100",
     "Resources": {"CPU": 32.0, "GPU": 8.0, "accelerator_type:A100": 1.0}},
    {"NodeID": "b" * 56, "Alive": True, "NodeManagerHostname": "gpu-h100",
     "Resources": {"CPU": 16.0, "GPU": 4.0, "accelerator_type:H100": 1.0, "nvlink": 1.0}},
    {"NodeID": "c" * 56, "Alive": False, "NodeManagerHostname": "gone", "Resources": {"CPU": 64.0, "GPU": 16.0}},
]


def point(tp: int) -> Point:
    return Point(index=1, id=f"01-tp{tp}", config={"tensor_parallel_size": tp}, flags=[])


def cluster(**executor) -> RayExecutor:
    return RayExecutor(ExecutorSection(kind="ray", **executor), owns_connection=False, nodes=NODES)


def test_a_point_holds_its_gpus_cpus_and_what_the_selector_asks_for() -> None:
    c = cluster(cpus_per_point=2, node_selector={"gpu_type": "H100", "resources": {"nvlink": 1}})
    assert c.bundle(point(4)) == {"GPU": 4.0, "CPU": 2.0, "accelerator_type:H100": 0.001, "nvlink": 1.0}
    assert cluster(cpus_per_point=0).bundle(point(1)) == {"GPU": 1.0}, "Ray refuses zero amounts"


def test_points_no_live_node_can_hold_are_refused_naming_every_node() -> None:
    assert cluster().unplaceable(point(8)) is None
    failure = cluster().unplaceable(point(16))  # only the dead node had 16
    assert failure.kind == "not_enough_gpus"
    assert failure.message == (
        "the point needs GPU 16, CPU 1 on one node (GPUs = tensor x pipeline parallel); the cluster's nodes have:"
        " gpu-a100 (aaaaaaaa): 8 GPU A100, 32 CPU; gpu-h100 (bbbbbbbb): 4 GPU H100, 16 CPU"
    )
    h100 = cluster(node_selector={"gpu_type": "H100"})
    assert h100.unplaceable(point(4)) is None
    assert h100.unplaceable(point(8)).kind == "not_enough_gpus", "the 8-GPU node is an A100"
    assert cluster(node_selector={"resources": {"nvlink": 1}}).unplaceable(point(8)).message.endswith(
        "gpu-a100 (aaaaaaaa): 8 GPU A100, 32 CPU, nvlink 0; gpu-h100 (bbbbbbbb): 4 GPU H100, 16 CPU, nvlink 1"
    )


def across(nodes: int, tp: int) -> Point:
    return Point(index=1, id=f"01-tp{tp}-n{nodes}", config={"tensor_parallel_size": tp, "nnodes": nodes}, flags=[])


def test_a_point_across_nodes_holds_its_share_of_gpus_on_each_of_that_many_nodes() -> None:
    assert cluster().bundle(across(2, 8)) == {"GPU": 4.0, "CPU": 1.0}
    assert cluster().unplaceable(across(2, 8)) is None, "4 GPUs on each of the two live nodes"
    assert cluster().unplaceable(across(2, 16)).kind == "not_enough_gpus", "8 per node: only the A100 node has them"
    failure = cluster().unplaceable(across(3, 6))
    assert failure.message == (
        "the point needs GPU 2, CPU 1 on each of 3 nodes (nnodes = 3; GPUs = tensor x pipeline parallel / nnodes);"
        " the cluster's nodes have: gpu-a100 (aaaaaaaa): 8 GPU A100, 32 CPU; gpu-h100 (bbbbbbbb): 4 GPU H100, 16 CPU"
    )
    assert cluster(node_selector={"gpu_type": "H100"}).unplaceable(across(2, 2)).kind == "not_enough_gpus"
