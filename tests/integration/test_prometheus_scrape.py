"""A real Prometheus server scrapes the planner's exporter during a real replay against the fake server.

Prometheus (Debian's `prometheus` binary) runs on loopback with a temporary config and storage,
scraping every second; the test reads the planner's series back through its HTTP API.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.exporter import PlannerMetrics
from replay.corpus.jsonl import load_corpus
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings
from tests.fakes.openai_server import Behavior, FakeServer
from tests.integration.prometheus import query, running_prometheus, wait_for_value

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "corpus" / "good.jsonl"


def test_promtool_accepts_the_docker_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (Debian package prometheus; make test installs it)"
    done = subprocess.run([promtool, "check", "config", str(ROOT / "docker" / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


@pytest.fixture
def exporter() -> Iterator[PlannerMetrics]:
    metrics = PlannerMetrics()
    metrics.start(host="127.0.0.1", port=0)
    yield metrics
    metrics.stop()


@pytest.fixture
def prometheus(tmp_path: Path, exporter: PlannerMetrics) -> Iterator[str]:
    """A Prometheus scraping the exporter every second; yields its base URL."""
    config = (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: planner\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    with running_prometheus(config, tmp_path / "prometheus") as url:
        # Prometheus hands new targets to its scrapers only every few seconds; wait for the first
        # scrape so the replay's steps are all observed.
        wait_for_value(url, 'up{job="planner"}', 1.0)
        yield url


@pytest.mark.timeout(90)
def test_prometheus_scrapes_the_planner_during_a_replay(prometheus: str, exporter: PlannerMetrics) -> None:
    # Each step lasts at least 2.5 s, so the 1 s scrapes land inside both of them.
    settings = ReplaySettings(concurrency=[2, 4], min_requests=30, warmup_requests=2, min_window_s=2.5)
    corpus = load_corpus(CORPUS)

    async def main():
        async with FakeServer(Behavior(ttft_s=0.03, itl_s=0.004)) as srv:
            return await run_replay(url=srv.url, corpus=corpus, settings=settings, slo={"ttft_p99_ms": 2000.0},
                                    observer=exporter)

    results = asyncio.run(main())
    assert [s.load.value for s in results.steps] == [2, 4]

    finished_ok = exporter.registry.get_sample_value("planner_requests_total", {"point": "replay", "status": "ok"})
    measured = exporter.registry.get_sample_value("planner_ttft_seconds_count", {"point": "replay"})
    assert finished_ok >= sum(s.requests_ok for s in results.steps)
    assert measured >= sum(s.requests_ok for s in results.steps)

    wait_for_value(prometheus, 'planner_requests_total{point="replay",status="ok"}', finished_ok)
    wait_for_value(prometheus, 'planner_ttft_seconds_count{point="replay"}', measured)
    wait_for_value(prometheus, 'planner_target_concurrency{point="replay"}', 4.0)
    wait_for_value(prometheus, 'planner_step_slo_pass{point="replay"}', 1.0 if results.steps[-1].slo_pass else 0.0)
    # Scraped while the steps ran, not only after: requests were in flight and the first step's
    # concurrency was on record.
    assert float(query(prometheus, 'max_over_time(planner_inflight_requests{point="replay"}[5m])')[0]["value"][1]) >= 1
    assert float(query(prometheus, 'min_over_time(planner_target_concurrency{point="replay"}[5m])')[0]["value"][1]) == 2
    p99 = query(prometheus, 'histogram_quantile(0.99, sum by (le) (planner_ttft_seconds_bucket{point="replay"}))')
    assert 0.03 <= float(p99[0]["value"][1]) <= 2.0
