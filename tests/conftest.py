"""Settings every tier shares."""

from __future__ import annotations

import signal


def pytest_configure(config) -> None:
    # A test run started in the background (`bash .ci/run &`, nohup) inherits SIGINT ignored, and
    # so would every planner it starts: the Ctrl-C tests would then only see a planner that cannot
    # be interrupted. With Python's handler back in this process, each child starts with SIGINT's
    # default disposition, as one started from a terminal does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
