"""Per-GPU figures of a cluster sweep that mixed GPU models are compared within each model."""

from __future__ import annotations

from pathlib import Path

from planner.report.markdown import render
from planner.report.view import build
from tests.fakes.results import sweep_fixture as _sweep


def _rendered(models: list[str | None]) -> str:
    sweep = _sweep()
    for point, model in zip(sweep.points, models):
        point.gpu_model = model
    return render(build(Path("sweep.json"), sweep), None, [])


def test_each_gpu_model_gets_its_points_and_its_best() -> None:
    sweep = _sweep()
    ok = [p for p in sweep.points if p.status == "ok" and p.safe_concurrency_per_gpu]
    assert len(ok) >= 2
    models = ["H100" if i % 2 == 0 else "A100" for i in range(len(sweep.points))]
    text = _rendered(models)
    start = text.index("## By GPU model")
    section = text[start:text.index("\n## ", start)]
    for model in ("A100", "H100"):
        assert f"### {model}" in section
        mine = [p for p, m in zip(sweep.points, models) if m == model]
        best = max(
            (p for p in mine if p.status == "ok" and p.safe_concurrency and p.safe_concurrency > 0),
            key=lambda p: (p.safe_concurrency / p.gpus, p.output_tokens_per_s_per_gpu or 0.0),
        )
        assert f"Best on {model}: `{best.id}`" in section
    # One row per point across the models' tables.
    assert sum(section.count(f"| `{p.id}`") for p in sweep.points) == len(sweep.points)


def test_no_section_when_one_model_or_none_is_recorded() -> None:
    n = len(_sweep().points)
    assert "## By GPU model" not in _rendered(["H100"] * n)
    assert "## By GPU model" not in _rendered([None] * n)


def test_a_point_across_nodes_lists_where_each_rank_ran() -> None:
    from planner.sweep.results import NodeRank

    sweep = _sweep()
    assert "## Points across nodes" not in render(build(Path("sweep.json"), sweep), None, [])
    point = sweep.points[0]
    point.ranks = [
        NodeRank(rank=0, node_id="a" * 56, node_hostname="gpu-a", gpu_ids=["0", "1"], gpu_model="H100",
                 log_path=f"points/{point.id}/server.log"),
        NodeRank(rank=1, node_id="b" * 56, node_hostname="gpu-b", gpu_ids=["2", "3"], gpu_model="H100",
                 log_path=f"points/{point.id}/server-rank1.log", exit_code=0),
    ]
    text = render(build(Path("sweep.json"), sweep), None, [])
    section = text[text.index("## Points across nodes"):]
    assert f"| `{point.id}` | 0 (API) | gpu-a | aaaaaaaa | 0, 1 | H100 | `points/{point.id}/server.log` |" in section
    assert f"| `{point.id}` | 1 | gpu-b | bbbbbbbb | 2, 3 | H100 | `points/{point.id}/server-rank1.log` |" in section


def test_every_failure_kind_has_a_suggestion() -> None:
    from typing import get_args

    from planner.capacity import FailureKind
    from planner.report.suggestions import SUGGESTIONS

    assert set(get_args(FailureKind)) - set(SUGGESTIONS) == set()
