"""The search at a scaled GPU timescale, on the fake server with a known law: it starts high
(the saturation probe's count in a replay, the capacity bound in a sweep), measures where it
learns, and finds the law's knee with default settings; running out of time is never "none"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from planner.sweep.results import SweepResults
from replay.results import ReplayResults
from tests.fakes.sweep_files import write_corpus, write_sweep_config

# ITL = 10 ms x (1 + 0.2 x running): 2 ms per running request. Under TPOT p90 <= 50.5 ms the
# law's knee is 20 (50 ms at 20 running, 52 at 21). Requests ask for 10 tokens: 0.1 s alone,
# 0.5 s at the knee. A p90 (a 100-request window) rather than the p99 of benchmarks/search_cost.py
# keeps the test short and its verdicts clear of a shared machine's scheduling tail.
ITL_S, GROWTH, TOKENS, BOUND_MS, KNEE = 0.010, 0.2, 10, 50.5, 20


def law_corpus(tmp_path: Path, n: int = 2000) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": TOKENS}) + "\n" for i in range(n)))
    return path


@pytest.mark.timeout(300)
def test_find_max_with_default_settings_finds_the_laws_knee_from_above(tmp_path, spawn_fake_server, capsys):
    url = spawn_fake_server("--itl-s", str(ITL_S), "--itl-growth-per-running", str(GROWTH), "--ttft-s", "0.01")
    out = tmp_path / "out"
    code = main([
        "replay", "--prompts", str(law_corpus(tmp_path)), "--url", url, "--find-max",
        "--slo", f"tpot_p90_ms={BOUND_MS},error_rate=0", "--output", str(out),
    ])
    assert code == 0
    results = ReplayResults.model_validate_json((out / "replay.json").read_text())
    steps = [(int(s.load.value), s.slo_verdict, s.tpot_ms.p99) for s in results.steps]
    # The fake runs every request it gets: the probe saw all 256 run at once, at about ten times
    # the TPOT bound, so the search began at 256 / 10, still above the knee.
    assert "ran all 256" in results.search_start_reason and "x the SLO" in results.search_start_reason, steps
    assert KNEE < results.search_start < 256, steps
    assert steps[0][0] == results.search_start and steps[0][1] == "fail"
    found = results.max_passing_concurrency
    assert found is not None and 0.75 * KNEE <= found <= KNEE, steps
    assert results.confirmed, steps
    # Measured where it learns: nothing far below the knee, and a handful of steps.
    assert min(c for c, _, _ in steps) >= KNEE // 2, steps
    assert len(steps) <= 9, steps
    # Steps well above the knee closed as soon as they were conclusive failures.
    assert all(s.window_closed_by == "verdict" for s in results.steps if s.load.value > 1.2 * KNEE)
    # Every window was sized from the request duration its warm-up measured.
    assert all(s.request_duration_s and s.window_limit_s for s in results.steps)
    printed = capsys.readouterr().out
    assert f"highest passing concurrency: {found} " in printed
    assert f"search started at {results.search_start} (saturation probe" in printed


@pytest.mark.timeout(120)
def test_a_search_out_of_time_says_unresolved_not_none(tmp_path, spawn_fake_server, capsys):
    # Windows of 0.3 s at 10 tokens of 10 ms: a p99 bound never gets its 368 requests in time.
    url = spawn_fake_server("--itl-s", str(ITL_S), "--ttft-s", "0.01")
    out = tmp_path / "out"
    code = main([
        "replay", "--prompts", str(law_corpus(tmp_path)), "--url", url, "--find-max", "--start-concurrency", "1",
        "--max-window-s", "0.3", "--point-budget-s", "8", "--slo", "tpot_p99_ms=1000", "--output", str(out),
    ])
    assert code == 0
    results = ReplayResults.model_validate_json((out / "replay.json").read_text())
    assert results.max_passing_concurrency is None and results.min_failing_concurrency is None
    assert {s.slo_verdict for s in results.steps} == {"unresolved"}
    assert results.unresolved_concurrency
    printed = capsys.readouterr().out
    assert "highest passing concurrency: unresolved" in printed
    assert "not failures" in printed


def law_sweep_config(tmp_path: Path) -> Path:
    # 512 KiB / 256 B per token = 2,048 tokens = 16 blocks of 128; one block a request (the
    # corpus's): the corpus-aware bound is about 16 in flight. ITL 10 ms x (1 + 0.2 x C): 26 ms
    # at 8, 28 at 9, against a TPOT p90 of 27 ms.
    return write_sweep_config(
        tmp_path,
        corpus=write_corpus(tmp_path / "corpus.jsonl", n=400),
        env={"FAKE_VLLM_ITL_S": "0.01", "FAKE_VLLM_ITL_GROWTH": "0.2", "FAKE_VLLM_TTFT_S": "0.005"},
        grid={"max_model_len": [1024]},
        extra={"kv_cache_memory_bytes": ["512K"]},
        slo={"tpot_p90_ms": 27, "error_rate": 0, "headroom": 0.2},
    )


@pytest.mark.timeout(300)
def test_a_sweep_point_starts_its_search_at_its_capacity_bound(tmp_path):
    cfg = law_sweep_config(tmp_path)
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    point = SweepResults.model_validate_json((out / "sweep.json").read_text()).points[0]
    assert point.status == "ok", point.failure
    concurrencies = [int(s.load.value) for s in point.steps]
    assert point.concurrency_upper_bound is not None and point.concurrency_upper_bound >= 12
    assert concurrencies[0] == point.search_upper_bound
    assert point.max_passing_concurrency is not None and 6 <= point.max_passing_concurrency <= 8, concurrencies
    assert point.confirmed
