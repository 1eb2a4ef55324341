"""Shared fixtures for integration tests that talk to the fake OpenAI-style server.

In-process use needs no fixture: tests run `asyncio.run(...)` and open
`async with FakeServer(Behavior(...)) as srv:` inside it. These fixtures cover what an event loop
cannot: the fake server as a separate process, and a port where nothing listens.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FAKE_SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "fakes" / "openai_server.py"
READY_PREFIX = "fake-openai-server ready on "
READY_TIMEOUT_S = 15.0


@pytest.fixture(autouse=True)
def interference_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the planner's logic against fakes on a machine other tests share: what
    else runs there is recorded but does not make a step disturbed (replay.environment). The tests
    of interference itself take this back with monkeypatch.delenv."""
    monkeypatch.setenv("PLANNER_REPLAY__ALLOW_INTERFERENCE", "true")


@pytest.fixture
def closed_port() -> int:
    """A loopback port that was free a moment ago, so a connect there is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def spawn_fake_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """`spawn_fake_server("--ttft-s", "0.05", ...)` starts the fake server as a process; returns its URL.

    Its output goes to a file in tmp_path (a pipe nobody reads could block it); every process
    started is terminated when the test ends.
    """
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(*args: str) -> str:
        log = tmp_path / f"fake-server-{len(procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(FAKE_SERVER_SCRIPT), "--host", "127.0.0.1", "--port", "0", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        deadline = time.perf_counter() + READY_TIMEOUT_S
        while time.perf_counter() < deadline and proc.poll() is None:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith(READY_PREFIX):
                    return line[len(READY_PREFIX) :].strip()
            time.sleep(0.02)
        proc.kill()
        proc.wait()
        raise RuntimeError(f"fake server did not start (args {args}); its output:\n{log.read_text(errors='replace')}")

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
