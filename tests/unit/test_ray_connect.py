"""The driver's connection to a Ray cluster: a client server that failed to start on the head is
asked for again, a bounded number of times, and every other failure is one clear error."""

from __future__ import annotations

import pytest

from planner.errors import ConfigError
from planner.sweep import ray_driver
from planner.sweep.config import ExecutorSection

# What ray.init raises when the head's proxier could not start this client's server (Ray 2.60).
START_FAILED = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n  File \"proxier.py\", line 773\n"
    "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err for detailed logs."
)

# The same failure as a fresh-clone CI run met it (Ray 2.60): the client server exited while the
# proxier waited on it, and the proxier's read of its command line raised. (That run's message was
# cut before the exception's name; psutil raises NoSuchProcess or ZombieProcess there.)
START_RAISED = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    '  File "ray/util/client/server/proxier.py", line 765, in Datapath\n'
    "    if not self.proxy_manager.start_specific_server(\n"
    '  File "ray/util/client/server/proxier.py", line 396, in start_specific_server\n'
    "    cmd = psutil_proc.cmdline()\n"
    "psutil.ZombieProcess: PID still exists but it's a zombie (pid=4242)"
)


@pytest.fixture
def calls(monkeypatch):
    made: list[str] = []
    monkeypatch.setattr(ray_driver.ray, "shutdown", lambda: made.append("shutdown"))
    return made


def fake_init(calls: list[str], failures: list[BaseException]):
    def init(**kwargs):
        calls.append("init")
        if failures:
            raise failures.pop(0)

    return init


def test_a_client_server_that_failed_to_start_is_asked_for_again(monkeypatch, calls, capsys):
    monkeypatch.setattr(ray_driver.ray, "init", fake_init(calls, [START_FAILED, START_FAILED]))
    waits: list[float] = []
    ray_driver._init_with_retries(ExecutorSection(kind="ray", address="ray://head:10001"), sleep=waits.append)
    assert calls == ["init", "shutdown", "init", "shutdown", "init"]
    assert waits == list(ray_driver.CONNECT_BACKOFF_S)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "planner: Ray's proxier at ray://head:10001 said 'RuntimeError: Starting Ray client server failed. See"
        f" ray_client_server_23000.err for detailed logs.' (try {n} of 3); connecting again in {w:g} s"
        for n, w in ((1, 1.0), (2, 2.0))
    ]


def test_the_retries_are_bounded_and_the_error_names_rays_line(monkeypatch, calls):
    monkeypatch.setattr(ray_driver.ray, "init", fake_init(calls, [START_FAILED] * 5))
    with pytest.raises(ConfigError) as err:
        ray_driver._init_with_retries(ExecutorSection(kind="ray", address="ray://head:10001"), sleep=lambda _s: None)
    assert calls.count("init") == ray_driver.CONNECT_ATTEMPTS == 3
    message = str(err.value)
    assert message.startswith("[executor] address 'ray://head:10001': cannot connect to a Ray cluster on each of 3 tries")
    assert "Starting Ray client server failed" in message


def test_any_other_failure_is_not_tried_again(monkeypatch, calls):
    monkeypatch.setattr(ray_driver.ray, "init", fake_init(calls, [ConnectionError("could not find any running Ray instance")]))
    with pytest.raises(ConfigError, match=r"cannot connect to a Ray cluster \(ConnectionError: could not find any"):
        ray_driver._init_with_retries(ExecutorSection(kind="ray", address="head:6379"), sleep=lambda _s: pytest.fail("slept"))
    assert calls == ["init", "shutdown"]


def test_a_client_server_that_exited_while_the_proxier_waited_is_asked_for_again(monkeypatch, calls, capsys):
    monkeypatch.setattr(ray_driver.ray, "init", fake_init(calls, [START_RAISED]))
    ray_driver._init_with_retries(ExecutorSection(kind="ray", address="ray://head:10001"), sleep=lambda _s: None)
    assert calls == ["init", "shutdown", "init"]
    assert capsys.readouterr().err == (
        "planner: Ray's proxier at ray://head:10001 said 'File \"ray/util/client/server/proxier.py\", line 396, in"
        " start_specific_server' (try 1 of 3); connecting again in 1 s\n"
    )
