"""`planner compare` and `planner replay --baseline` on runs against the fake server: the same
law measured again compares `unchanged`; the law slowed by 20% compares `regressed`, naming the
load and the statistic, and `--fail-on regression` fails the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main

# ITL = 5 ms x (1 + growth x running): at 4 in flight 25 ms with growth 1, 30 ms (+20%) with 1.25.
LAW = ("--itl-s", "0.005", "--ttft-s", "0.005", "--slowness-sigma", "0.3")
SLO = "tpot_p50_ms=1000,error_rate=0"


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"request {i}: tell me about KV caches", "max_tokens": 8}) + "\n" for i in range(300)))
    return path


def _replay(url: str, corpus: Path, out: Path, *extra: str) -> int:
    return main([
        "replay", "--prompts", str(corpus), "--url", url, "--concurrency", "4", "--min-requests", "200",
        "--max-requests", "200", "--slo", SLO, "--output", str(out), *extra,
    ])  # fmt: skip


@pytest.mark.timeout(300)
def test_same_law_is_unchanged_and_a_20_percent_slowdown_regresses(tmp_path, spawn_fake_server, capsys):
    corpus = _corpus(tmp_path)
    base, again, slow = tmp_path / "base", tmp_path / "again", tmp_path / "slow"
    assert _replay(spawn_fake_server(*LAW, "--itl-growth-per-running", "1", "--seed", "1"), corpus, base) == 0
    assert _replay(spawn_fake_server(*LAW, "--itl-growth-per-running", "1", "--seed", "2"), corpus, again) == 0
    capsys.readouterr()

    assert main(["compare", str(base), str(again), "--fail-on", "regression"]) == 0
    printed = capsys.readouterr().out
    assert ": UNCHANGED" in printed.splitlines()[0]
    assert "changed: corpus unchanged" in printed
    same = json.loads((again / "compare.json").read_text())
    assert same["verdict"] == "unchanged" and same["tests"] == 2
    assert {r["statistic"]: r["verdict"] for r in same["points"][0]["statistics"]} == {
        "tpot_p50_ms": "unchanged",
        "output_tokens_per_s_per_gpu": "unchanged",
    }
    assert (again / "compare.md").is_file() and (again / "compare-tpot_p50_ms.png").is_file()

    # The slowed law, compared at the end of its own run (--baseline) and failing the gate.
    slow_url = spawn_fake_server(*LAW, "--itl-growth-per-running", "1.25", "--seed", "3")
    assert _replay(slow_url, corpus, slow, "--baseline", str(base), "--fail-on", "regression") == 1
    printed = capsys.readouterr().out
    assert ": REGRESSED" in printed
    assert "replay of fake-model: regressed" in printed
    assert "tpot_p50_ms at 4 regressed (+" in printed
    worse = json.loads((slow / "compare.json").read_text())
    rows = {r["statistic"]: r for r in worse["points"][0]["statistics"]}
    assert rows["tpot_p50_ms"]["verdict"] == "regressed" and rows["tpot_p50_ms"]["value"] == 4
    assert 0.10 < rows["tpot_p50_ms"]["change_fraction"] < 0.30
    assert rows["output_tokens_per_s_per_gpu"]["verdict"] == "regressed"
    # The standalone command says the same; without --fail-on it only informs.
    assert main(["compare", str(base), str(slow), "--output", str(tmp_path / "cmp")]) == 0
    assert main(["compare", str(base), str(slow), "--output", str(tmp_path / "cmp"), "--fail-on", "change"]) == 1
    # Both runs recorded what they measured.
    identity = json.loads((slow / "replay.json").read_text())["identity"]
    assert identity["planner_version"] and identity["corpus_sha256"] and identity["slo"]["tpot_p50_ms"] == 1000
    assert identity["model"]["name"] == "fake-model" and identity["hardware"]["kind"] in ("cpu", "gpu")


def test_a_missing_baseline_is_refused_before_any_load(tmp_path, capsys):
    code = main([
        "replay", "--prompts", str(_corpus(tmp_path)), "--url", "http://127.0.0.1:9", "--concurrency", "1",
        "--output", str(tmp_path / "out"), "--baseline", str(tmp_path / "nowhere"),
    ])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"planner replay: error: {tmp_path / 'nowhere'}: no such results folder"
