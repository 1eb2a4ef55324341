"""The exported alert rules in a real Prometheus that scrapes the fake vLLM under load.

A sweep of the fake vLLM program (tests/fakes/fake_vllm.py, whose TPOT grows with concurrency)
finds a safe concurrency; `planner export --format alerts` turns it into rules; Prometheus
(Debian's binary, as the other integration tests run it) loads them and scrapes a fake server
serving the same model while a replay holds a concurrency at the safe one (the "running above
safe concurrency" alert stays quiet) and then above it (the alert fires).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from planner.cli import main
from planner.export.alerts import RUNNING_ALERT
from planner.sweep.results import SweepResults
from replay.corpus import load_corpus
from replay.session import run_replay
from replay.settings import ReplaySettings
from tests.fakes.openai_server import Behavior, FakeServer
from tests.fakes.sweep_files import FAKE_VLLM, write_corpus
from tests.integration.prometheus import query, running_prometheus, wait_for_value

ALERT_TIMEOUT_S = 30.0


def _sweep(tmp_path: Path) -> tuple[Path, str]:
    """Run a one-point sweep of the fake vLLM (known answer: safe concurrency 4, as in test_sweep)."""
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    model = f"export-{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(f"""
prompts = "{corpus}"
[server]
command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE_VLLM))}]
model = "{model}"
args = ["--enforce-eager"]
env = {{ FAKE_VLLM_ITL_S = "0.04", FAKE_VLLM_ITL_GROWTH = "0.5", FAKE_VLLM_TTFT_S = "0.005" }}
startup_timeout_s = 30
stop_grace_s = 5
[grid]
max_model_len = [2048]
[grid.extra]
kv_cache_memory_bytes = ["4M"]
[replay]
start_concurrency = 4
min_requests = 30
max_window_s = 60
request_timeout_s = 30
[slo]
tpot_p50_ms = 150
error_rate = 0
max_preemptions = 0
headroom = 0.2
[gpus]
devices = "none"
""")
    out = tmp_path / "sweep"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    return out, model


def _hold(url: str, corpus_path: Path, concurrency: int) -> None:
    """A replay that holds `concurrency` requests in flight for several seconds of scrapes."""
    settings = ReplaySettings(concurrency=[concurrency], min_requests=20, warmup_requests=0, min_window_s=6.0)
    result = asyncio.run(run_replay(url=url, corpus=load_corpus(corpus_path), settings=settings, slo={}))
    assert result.steps and result.steps[0].requests_ok > 0


def _alert_seen(prometheus: str, state: str = "firing") -> bool:
    rows = query(prometheus, f'max_over_time(ALERTS{{alertname="{RUNNING_ALERT}",alertstate="{state}"}}[5m])')
    return bool(rows)


@pytest.mark.timeout(300)
def test_running_above_the_safe_concurrency_fires_and_at_it_stays_quiet(tmp_path):
    sweep, model = _sweep(tmp_path)
    measured = SweepResults.model_validate_json((sweep / "sweep.json").read_text()).points[0]
    safe = measured.safe_concurrency
    assert safe and safe >= 2
    # The start-up the probes are sized from is recorded with the point.
    assert measured.startup_s is not None and 0 < measured.startup_s <= 30

    deploy = tmp_path / "deploy"
    assert main(["export", str(sweep), "--format", "alerts", "--output", str(deploy),
                 "--alert-window", "30s", "--alert-for", "1s"]) == 0
    rules = yaml.safe_load((deploy / "alerts.rules.yaml").read_text())["groups"][0]["rules"]
    running = next(r for r in rules if r["alert"] == RUNNING_ALERT)
    assert running["expr"] == f'vllm:num_requests_running{{model_name="{model}"}} > {safe}'

    async def serve_and_probe():
        # Requests of about 0.6 s each (6 tokens, 0.1 s apart), so the concurrency holds between scrapes.
        async with FakeServer(Behavior(models=[model], ttft_s=0.05, itl_s=0.1)) as fake:
            host_port = fake.url.split("//", 1)[1]
            config = (
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
                f"rule_files: [{json.dumps(str(deploy / 'alerts.rules.yaml'))}]\n"
                "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
                f"      - targets: ['{host_port}']\n"
            )
            with running_prometheus(config, tmp_path / "prometheus") as prometheus:
                await asyncio.to_thread(wait_for_value, prometheus, 'up{job="vllm"}', 1.0)

                # At the safe concurrency: the fleet is inside the envelope.
                await asyncio.to_thread(_hold, fake.url, tmp_path / "corpus.jsonl", safe)
                await asyncio.sleep(3)  # the last scrapes and rule evaluations of the step
                peak = query(prometheus, f'max_over_time(vllm:num_requests_running{{model_name="{model}"}}[2m])')
                assert float(peak[0]["value"][1]) == safe  # scraped while it held `safe` in flight
                assert not _alert_seen(prometheus, "pending") and not _alert_seen(prometheus, "firing")

                # Above it: the alert fires.
                await asyncio.to_thread(_hold, fake.url, tmp_path / "corpus.jsonl", safe + 2)
                deadline = time.perf_counter() + ALERT_TIMEOUT_S
                while not _alert_seen(prometheus):
                    assert time.perf_counter() < deadline, f"{RUNNING_ALERT} never fired above {safe}"
                    await asyncio.sleep(0.5)

    asyncio.run(serve_and_probe())
