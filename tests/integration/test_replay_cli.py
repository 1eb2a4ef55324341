"""`planner replay` as a user runs it, against the fake server in its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.cli import main
from replay.results import ReplayResults
from tests.integration.stopping import signal_and_wait

ROOT = Path(__file__).resolve().parents[2]


def corpus(tmp_path: Path, n: int = 80) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"request {i}: tell me about KV caches", "max_tokens": 6}) + "\n" for i in range(n)))
    return path


@pytest.mark.timeout(240)
def test_find_max_against_a_server_whose_latency_grows_with_load(tmp_path, spawn_fake_server, capsys):
    # ITL = 20 ms x (1 + 2 x running): 100 ms at 2 in flight, 140 at 3. TPOT (a request's mean gap)
    # is the SLO: a starved server sends tokens in bursts, which skews a median gap, not a mean.
    url = spawn_fake_server("--itl-s", "0.02", "--itl-growth-per-running", "2", "--ttft-s", "0.005")
    out = tmp_path / "out"
    code = main([
        "replay", "--prompts", str(corpus(tmp_path)), "--url", url, "--find-max", "--min-requests", "20",
        "--max-concurrency", "8", "--slo", "tpot_p50_ms=120,error_rate=0", "--output", str(out),
    ])
    assert code == 0
    results = ReplayResults.model_validate_json((out / "replay.json").read_text())
    # From the cap (8: TPOT 340 ms, 2.8 times the bound) the search goes straight to 8 / 2.8 = 2,
    # then one step above (3); the highest pass (2) is measured again on fresh prompts.
    assert [int(s.load.value) for s in results.steps] == [8, 2, 3, 2]
    assert (results.max_passing_concurrency, results.min_failing_concurrency) == (2, 3)
    assert results.confirmed and results.knee_interval == [2, 3]
    assert [s.slo_verdict for s in results.steps] == ["fail", "pass", "fail", "pass"]
    assert (results.search_start, results.search_start_reason) == (8, "max_concurrency")
    assert results.binding_constraint == "tpot_p50_ms"
    assert results.model == "fake-model" and results.corpus.requests == 80 and len(results.corpus.sha256) == 64
    assert all(s.requests_ok >= 20 and s.tokens_source == "usage" for s in results.steps)
    assert all(s.server.metrics_available for s in results.steps)
    assert (out / "report.md").exists()
    printed = capsys.readouterr().out
    assert "highest passing concurrency: 2  (lowest failing: 3; bound by: tpot_p50_ms)" in printed


def test_unreachable_server_is_one_clear_error_before_any_load(tmp_path, closed_port, capsys):
    code = main(["replay", "--prompts", str(corpus(tmp_path)), "--url", f"http://127.0.0.1:{closed_port}", "--concurrency", "1"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"planner replay: error: nothing answers at http://127.0.0.1:{closed_port}")
    assert len(err.splitlines()) == 1


def test_wrong_api_key_and_unknown_model_say_so(tmp_path, spawn_fake_server, capsys):
    url = spawn_fake_server("--api-key", "right")
    assert main(["replay", "--prompts", str(corpus(tmp_path)), "--url", url, "--concurrency", "1", "--api-key", "wrong"]) == 2
    assert "the server rejected the API key" in capsys.readouterr().err
    assert main([
        "replay", "--prompts", str(corpus(tmp_path)), "--url", url, "--concurrency", "1", "--api-key", "right",
        "--model", "llama-9000",
    ]) == 2
    assert "model 'llama-9000' is not served here; served models: fake-model" in capsys.readouterr().err


def test_bad_corpus_line_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    assert main(["replay", "--prompts", str(path), "--url", "http://127.0.0.1:9", "--concurrency", "1"]) == 2
    assert f"{path}:2: " in capsys.readouterr().err


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("sig", "status", "message"),
    [
        (signal.SIGINT, 130, "planner replay: interrupted; results measured so far are kept"),
        (signal.SIGTERM, 143, "planner replay: terminated (SIGTERM); results measured so far are kept"),
    ],
)
def test_ctrl_c_or_sigterm_keeps_the_finished_steps(tmp_path, spawn_fake_server, sig, status, message):
    url = spawn_fake_server("--itl-s", "0.01", "--ttft-s", "0.005")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner", "replay", "--prompts", str(corpus(tmp_path)), "--url", url,
         "--concurrency", "2,2,2,2,2,2,2,2", "--min-requests", "30", "--output", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if len(json.loads((out / "replay.json").read_text())["steps"]) >= 2:
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    err = signal_and_wait(proc, sig)
    assert proc.returncode == status
    # Progress lines go to stderr too; the stop itself is one line at the end, with no traceback.
    assert err.decode().splitlines()[-1] == message
    assert b"Traceback" not in err and b"Error" not in err
    results = ReplayResults.model_validate_json((out / "replay.json").read_text())
    assert results.interrupted
    assert 2 <= len(results.steps) < 8


@pytest.mark.timeout(120)
def test_a_loopback_server_is_found_by_its_port_and_each_step_records_its_environment(tmp_path, spawn_fake_server, capsys):
    from planner import quiet

    url = spawn_fake_server("--itl-s", "0.005", "--ttft-s", "0.005")
    where = quiet.locate_server(url)
    assert len(where.pids) == 1 and b"openai_server.py" in Path(f"/proc/{where.pids[0]}/cmdline").read_bytes()
    out = tmp_path / "out"
    code = main([
        "replay", "--prompts", str(corpus(tmp_path)), "--url", url, "--concurrency", "2", "--min-requests", "20",
        "--slo", "error_rate=0", "--output", str(out),
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("the machine is ")
    results = ReplayResults.model_validate_json((out / "replay.json").read_text())
    (step,) = results.steps
    cpu = step.environment.cpu
    # The server's own process was told apart from the others: it streamed every token.
    assert cpu.server_cpu_s is not None and cpu.server_cpu_s > 0 and cpu.other_share_server_cpus is not None
    assert cpu.load_avg_1m is not None and cpu.steal_share is not None
    # The conftest allows interference on this shared machine: recorded, said, never flagged.
    assert results.interference_allowed and step.disturbed == []
    assert "interference allowed (--allow-interference)" in printed


@pytest.mark.timeout(60)
def test_require_quiet_stops_before_the_load_on_a_busy_machine(tmp_path, spawn_fake_server, capsys):
    url = spawn_fake_server("--itl-s", "0.005", "--ttft-s", "0.005")
    # A process spinning on every CPU this test may use: more than 10% of them, whatever else runs.
    spin = "while True: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.3)
        code = main([
            "replay", "--prompts", str(corpus(tmp_path)), "--url", url, "--concurrency", "1", "--min-requests", "20",
            "--require-quiet", "--output", str(tmp_path / "out"),
        ])
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert code == 2
    err = capsys.readouterr().err
    assert "--require-quiet: the machine is busy: load average" in err and "busiest: " in err
    # Nothing was sent: no results were written.
    assert not (tmp_path / "out" / "replay.json").exists()
