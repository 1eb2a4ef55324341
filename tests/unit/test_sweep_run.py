"""The sweep's planning: which points of an earlier run --resume keeps."""

from __future__ import annotations

from planner.capacity import Failure
from planner.sweep.results import PointResult
from planner.sweep.run import reusable


def test_resume_keeps_pruned_points_only_while_pruning():
    pruned = PointResult(id="p", config={}, command=[], status="predicted_infeasible", fingerprint="f",
                         failure=Failure(kind="predicted_infeasible", message="m"))
    assert reusable(pruned, prune=True) and not reusable(pruned, prune=False)
    no_gpus = pruned.model_copy(update={"status": "infeasible", "failure": Failure(kind="world_size_too_large", message="m")})
    assert not reusable(no_gpus, prune=True)
    refused_by_vllm = no_gpus.model_copy(update={"command": ["vllm", "serve"]})
    assert reusable(refused_by_vllm, prune=True)
