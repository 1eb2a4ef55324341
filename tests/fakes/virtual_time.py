"""An event loop with a virtual clock, for tests of timing logic: whenever nothing is ready to run,
the clock jumps to the next timer. Sleeps cost no wall time and every duration is exact, so a test
can assert rates and spans exactly, whatever the machine's load. Only for code that waits on
timers (asyncio.sleep, wait_for), not on sockets or threads."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def _run_once(self) -> None:
        # BaseEventLoop._run_once sleeps in select() until the first timer is due; with nothing
        # ready, move the clock there instead.
        if not self._ready and self._scheduled:
            self._virtual_now = max(self._virtual_now, self._scheduled[0]._when)
        super()._run_once()


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a VirtualTimeLoop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)


def virtual_clock() -> float:
    """The running loop's clock: pass as run_step's `clock` and the sender's."""
    return asyncio.get_running_loop().time()
