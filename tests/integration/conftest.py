"""Shared fixtures for integration tests that talk to the fake OpenAI-style server.

In-process use needs no fixture: tests run `asyncio.run(...)` and open
`async with FakeServer(Behavior(...)) as srv:` inside it. These fixtures cover what an event loop
cannot: the fake server as a separate process, and a port where nothing listens.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fakes.openai_server import start_process
from tests.integration.stopping import terminate_and_wait

READY_TIMEOUT_S = 15.0


@pytest.fixture(autouse=True)
def interference_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the planner's logic against fakes on a machine other tests share: what
    else runs there is recorded but does not make a step disturbed (replay.step.environment). The
    tests of interference itself take this back with monkeypatch.delenv."""
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
    procs: list[subprocess.Popen] = []

    def spawn(*args: str) -> str:
        proc, url = start_process(
            tmp_path / f"fake-server-{len(procs)}.log", "--host", "127.0.0.1", "--port", "0", *args,
            ready_timeout_s=READY_TIMEOUT_S,
        )
        procs.append(proc)
        return url

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        terminate_and_wait(proc, timeout_s=5)
