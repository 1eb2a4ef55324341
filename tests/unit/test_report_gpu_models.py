"""Per-GPU figures of a cluster sweep that mixed GPU models are compared within each model."""

from __future__ import annotations

from pathlib import Path

from planner.report.markdown import render
from planner.report.view import build
from tests.unit.test_report import _sweep


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
