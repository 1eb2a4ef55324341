"""A throwaway Prometheus for integration tests: Debian's `prometheus` binary on a loopback port,
with a config and storage of its own, stopped when the test (or module) is done."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.integration.stopping import terminate_and_wait

READY_TIMEOUT_S = 30.0
QUERY_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_prometheus(config_text: str, workdir: Path) -> Iterator[str]:
    """Start Prometheus with this config; yields its base URL once it answers /-/ready."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed (Debian package prometheus; make test installs it)"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(config_text)
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
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
        yield url
    finally:
        terminate_and_wait(proc)


def query(url: str, promql: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5.0)
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for_value(url: str, promql: str, expected: float, timeout_s: float = QUERY_TIMEOUT_S) -> float:
    """Poll until the query's single value equals `expected` (the next scrape brings it); bounded."""
    deadline = time.perf_counter() + timeout_s
    last = None
    while time.perf_counter() < deadline:
        result = query(url, promql)
        if len(result) == 1:
            last = float(result[0]["value"][1])
            if last == expected:
                return last
        time.sleep(0.25)
    raise AssertionError(f"{promql} was {last}, never {expected}, within {timeout_s} s")
