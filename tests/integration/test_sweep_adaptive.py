"""[sweep] strategy = "adaptive" against the fake vLLM, beside "exhaustive" on the same grid.

The fake's law (tests/fakes/fake_vllm.py): ITL = 20 ms x (1 + g x running), g = 0.5 x
max_num_batched_tokens / 2048. Under tpot_p50_ms = 75 the latency knee is 5 for 2048 tokens a
step and 2 for 4096: two speed classes. Each has a 4 MiB pool (about 127 requests of one block)
and a 128 KiB one (4 blocks: 4 requests), at max_num_seqs 64 and 3 (above 3 requests wait for a
slot, which max_waiting = 0 forbids, so max_num_seqs caps what passes). The law's best: 2048 tokens, 4 MiB, 64 seqs: knee 5, safe
floor(5 x 0.8) = 4 per GPU; every other point is below it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cli import main
from planner.sweep.results import SweepResults
from tests.fakes.sweep_files import write_corpus, write_sweep_config


def write_config(tmp_path: Path, strategy: str, *, tokens: tuple[int, ...] = (2048, 4096), **sweep_keys) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return write_sweep_config(
        tmp_path,
        corpus=write_corpus(tmp_path / "corpus.jsonl"),
        env={"FAKE_VLLM_ITL_S": "0.02", "FAKE_VLLM_ITL_GROWTH": "0.5", "FAKE_VLLM_TTFT_S": "0.005"},
        grid={"max_model_len": [128]},
        extra={"max_num_batched_tokens": list(tokens), "kv_cache_memory_bytes": ["4M", "128K"], "max_num_seqs": [64, 3]},
        replay={"start_concurrency": 4, "min_requests": 20, "max_window_s": 60, "request_timeout_s": 30},
        slo={"tpot_p50_ms": 75, "ttft_max_ms": 150, "max_waiting": 0, "error_rate": 0, "headroom": 0.2},
        more={"sweep": {"strategy": strategy, **sweep_keys}},
    )


def sweep(tmp_path: Path, strategy: str) -> tuple[SweepResults, str]:
    out = tmp_path / strategy / "out"
    assert main(["sweep", "--config", str(write_config(tmp_path / strategy, strategy)), "--output", str(out)]) == 0
    return SweepResults.model_validate_json((out / "sweep.json").read_text()), (out / "report.md").read_text()


def shape(point) -> tuple:
    c = point.config
    return (c["max_num_batched_tokens"], c["kv_cache_memory_bytes"], c["max_num_seqs"])


@pytest.mark.timeout(900)
def test_adaptive_finds_the_laws_best_as_exhaustive_does_searching_one_point_per_class(tmp_path, capsys):
    adaptive, report = sweep(tmp_path, "adaptive")
    assert "adaptive: 2 searched, 0 verified, 6 predicted, 0 dominated; 0 verification(s) fell back" in capsys.readouterr().out
    assert "## How the points were answered" in report
    by_shape = {shape(p): p for p in adaptive.points}
    assert [c.label for c in adaptive.speed_classes] == ["max_num_batched_tokens=2048", "max_num_batched_tokens=4096"]

    # One full search per class: the largest pool, most seqs.
    searched = sorted(shape(p) for p in adaptive.points if p.answer_source == "searched")
    assert searched == [(2048, "4M", 64), (4096, "4M", 64)]
    best = by_shape[(2048, "4M", 64)]
    assert adaptive.best.point_id == best.id
    assert best.status == "ok" and best.confirmed and best.max_passing_concurrency == 5 and best.safe_concurrency_per_gpu == 4
    law = next(c.law for c in adaptive.speed_classes if c.id == best.speed_class)
    assert (law.from_point, law.max_passing, law.min_failing) == (best.id, 5, 6)
    assert law.fitted["tpot_p50_ms"] and law.crossings["tpot_p50_ms"] == pytest.approx(5.5, abs=0.6)

    # Every other point is settled without a search, and says why.
    for p in adaptive.points:
        if p.answer_source == "searched":
            continue
        assert p.status == p.answer_source == "predicted", (p.id, p.status)
        assert p.steps == [] and p.answer_note and best.id in p.answer_note
        assert adaptive.best.others[p.id] == p.answer_note
    capped = by_shape[(2048, "4M", 3)].knee_prediction
    assert (capped.concurrency, capped.interval, capped.limit) == (3, [3, 3], "max_num_seqs")
    assert adaptive.adaptive.model_dump() == {"searched": 2, "verified": 0, "predicted": 6, "dominated": 0, "fallbacks": 0}

    exhaustive, report = sweep(tmp_path, "exhaustive")
    assert "## How the points were answered" not in report
    assert exhaustive.adaptive is None and {p.answer_source for p in exhaustive.points} == {"searched"}
    assert shape(next(p for p in exhaustive.points if p.id == exhaustive.best.point_id)) == (2048, "4M", 64)
    assert exhaustive.best.safe_concurrency_per_gpu == adaptive.best.safe_concurrency_per_gpu == 4
    # What adaptive predicted for the points it did not search holds where exhaustive measured them.
    for p in exhaustive.points:
        predicted = by_shape[shape(p)]
        if predicted.answer_source == "predicted":
            top = predicted.knee_prediction.interval[1]
            assert p.safe_concurrency_per_gpu is None or p.safe_concurrency_per_gpu <= 4, p.id
            assert p.max_passing_concurrency is None or top is None or p.max_passing_concurrency <= max(top, 4), p.id


@pytest.mark.timeout(600)
def test_verify_predictions_all_measures_every_prediction_of_the_class(tmp_path, capsys):
    # One class (2048 tokens a step): the 4 MiB, 64-seq point is searched; the three others,
    # which cannot beat it, are started all the same and their predictions verified.
    out = tmp_path / "out"
    config = write_config(tmp_path, "adaptive", tokens=(2048,), verify_predictions="all")
    assert main(["sweep", "--config", str(config), "--output", str(out)]) == 0
    results = SweepResults.model_validate_json((out / "sweep.json").read_text())
    by_shape = {shape(p)[1:]: p for p in results.points}
    assert by_shape[("4M", 64)].answer_source == "searched" and results.best.point_id == by_shape[("4M", 64)].id
    expected = {("4M", 3): (3, "max_num_seqs"), ("128K", 64): (4, "kv_pool"), ("128K", 3): (3, "max_num_seqs")}
    for key, (concurrency, limit) in expected.items():
        p = by_shape[key]
        assert p.status == "ok" and p.answer_source == "verified" and p.knee_prediction.verified is True, (key, p.answer_note)
        assert (p.knee_prediction.concurrency, p.knee_prediction.limit) == (concurrency, limit), key
        assert p.max_passing_concurrency == concurrency and p.dominance is None
        assert 2 <= len(p.steps) <= 3, [s.load.value for s in p.steps]
    assert results.adaptive.model_dump() == {"searched": 1, "verified": 3, "predicted": 0, "dominated": 0, "fallbacks": 0}
