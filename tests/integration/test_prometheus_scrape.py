"""A real Prometheus server scrapes the planner's exporter during a real replay against the fake server.

Prometheus (Debian's `prometheus` binary) runs on loopback with a temporary config and storage,
scraping every second; the test reads the planner's series back through its HTTP API.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from planner.exporter import PlannerMetrics
from replay.corpus import load_corpus
from replay.session import run_replay
from replay.settings import ReplaySettings
from tests.fakes.openai_server import Behavior, FakeServer

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "corpus" / "good.jsonl"
READY_TIMEOUT_S = 30.0
QUERY_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (Debian package prometheus; make test installs it)"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: planner\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    port = _free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.perf_counter() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
            try:
                if httpx.get(f"{url}/-/ready", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.perf_counter() > deadline:
                raise RuntimeError(f"prometheus not ready in {READY_TIMEOUT_S} s:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)
        # Prometheus hands new targets to its scrapers only every few seconds; wait for the first
        # scrape so the replay's steps are all observed.
        wait_for_value(url, 'up{job="planner"}', 1.0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def query(url: str, promql: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5.0)
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for_value(url: str, promql: str, expected: float) -> float:
    """Poll until the query's single value equals `expected` (the next scrape brings it); bounded."""
    deadline = time.perf_counter() + QUERY_TIMEOUT_S
    last = None
    while time.perf_counter() < deadline:
        result = query(url, promql)
        if len(result) == 1:
            last = float(result[0]["value"][1])
            if last == expected:
                return last
        time.sleep(0.25)
    raise AssertionError(f"{promql} was {last}, never {expected}, within {QUERY_TIMEOUT_S} s")


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
