"""Running a command's event loop so that SIGTERM ends it as Ctrl-C does.

`timeout`, systemd, Kubernetes and CI runners stop a process with SIGTERM. `asyncio.run` turns
Ctrl-C into a cancelled main task (so every `finally` runs: servers stopped, results saved) and
then KeyboardInterrupt; for SIGTERM it does nothing, and the default action kills the process
before anything is saved. `run` cancels the main task on the first SIGTERM in the same way and
then raises `Terminated`, which the CLI turns into one line and exit status 143 (128 + 15).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_STATUS = 128 + signal.SIGTERM


class Terminated(BaseException):
    """The command was stopped by SIGTERM after its cleanup ran.

    A BaseException, as KeyboardInterrupt is, so that no `except Exception` on the way out can
    mistake a stop for an error of the command.
    """


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, with SIGTERM cancelling the main task and then raising Terminated."""
    terminated = False

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None  # always set inside a running task

        def on_sigterm() -> None:
            nonlocal terminated
            # A second SIGTERM must not cancel the cleanup the first one started.
            if not terminated:
                terminated = True
                task.cancel()

        # Off the main thread (or where the loop has no signal support) SIGTERM keeps its default.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await coro
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if terminated:
            raise Terminated from None
        raise
