"""When a step sends: the cursor over the corpus, and one driver per kind of load.

A driver starts arrivals through `start(item, scheduled_s)` (one request, or a session's whole
conversation; replay.load.conversation) until `stop` is set: a closed loop keeps n arrivals
running, an open loop (Poisson rate, trace replay) starts them on a schedule of offsets. When to
stop is the window's business (replay.step.window), not the driver's.

A closed loop may ramp up: its n workers start evenly over `ramp_s` seconds instead of all at
once. Started together, n requests prefill together and, where their lengths are alike, run and
end nearly in phase, wave after wave: the KV cache peaks when every request of the wave nears its
end, above what the same load holds once the requests' phases are spread, and a window that opens
on that wave measures the opening, not the load. Spread over one request duration, the workers'
phases start out even, which is where a closed loop left to run for long ends up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence

from replay.load.kinds import Concurrency, Load, PoissonRate, TraceReplay, poisson_offsets, trace_offsets

# What one arrival starts: a request, or a session's whole conversation.
Start = Callable[..., Awaitable[object]]


class RequestCursor:
    """Hands out corpus requests in order, wrapping around; shared by every step of a run so
    that consecutive steps send different requests (repeats would hit the prefix cache)."""

    def __init__(self, requests: Sequence) -> None:
        if not requests:
            raise ValueError("no requests to send")
        self._requests = requests
        self._next = 0

    def next(self):
        req = self._requests[self._next]
        self._next = (self._next + 1) % len(self._requests)
        return req


async def stopped_within(stop: asyncio.Event, delay_s: float) -> bool:
    """Waits `delay_s` seconds (none when not positive) unless `stop` is set first; True when it was."""
    if delay_s <= 0:
        return False
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
        return True
    except TimeoutError:
        return False


async def closed_loop(start: Start, cursor: RequestCursor, n: int, stop: asyncio.Event, *, ramp_s: float = 0.0) -> None:
    """n workers, each sending its next request as soon as its last one ends; worker i starts
    i x ramp_s / n seconds in (all at once with no ramp)."""

    async def worker(delay_s: float) -> None:
        if await stopped_within(stop, delay_s):
            return
        while not stop.is_set():
            await start(cursor.next(), None)

    # A TaskGroup: should one worker fail, the others stop with it instead of sending on.
    async with asyncio.TaskGroup() as group:
        for i in range(n):
            group.create_task(worker(i * ramp_s / n))


async def open_loop(
    start: Start, schedule: Iterable[tuple[float, object]], stop: asyncio.Event, *, max_inflight: int,
    clock: Callable[[], float],
) -> None:
    """Arrivals at `schedule`'s offsets (seconds from now), whatever is still running, never more
    than `max_inflight` at once; returns once the schedule ran out (or `stop`) and every request
    it started has ended."""
    slots = asyncio.Semaphore(max_inflight)
    inflight: set[asyncio.Task] = set()
    t0 = clock()
    for offset, item in schedule:
        if stop.is_set():
            break
        if await stopped_within(stop, t0 + offset - clock()):
            break
        await slots.acquire()
        task = asyncio.create_task(start(item, t0 + offset))
        inflight.add(task)
        task.add_done_callback(lambda t: (inflight.discard(t), slots.release()))
    if inflight:
        await asyncio.gather(*inflight)


def schedule(load: Load, cursor: RequestCursor, arrivals: Sequence | None) -> Iterable[tuple[float, object]]:
    """An open loop's (offset, item) arrivals: Poisson offsets over the cursor, or the corpus's own
    timestamps (`arrivals`: its requests, or its sessions) for a trace."""
    match load:
        case PoissonRate(rate_per_s=rate, seed=seed):
            return ((offset, cursor.next()) for offset in poisson_offsets(rate, seed))
        case TraceReplay(speed=speed):
            if arrivals is None:
                raise ValueError("trace replay needs the corpus")
            stamps = [r.timestamp_s for r in arrivals]
            return ((off, arrivals[i]) for off, i in trace_offsets(stamps, speed))
    raise ValueError(f"{load!r} has no schedule: it is a closed loop")


async def drive(
    load: Load, start: Start, cursor: RequestCursor, stop: asyncio.Event, *, arrivals: Sequence | None,
    max_inflight: int, clock: Callable[[], float], ramp_s: float = 0.0,
) -> bool:
    """Sends `load` until `stop`. True when it was an open loop that returned by itself: a finite
    schedule ran out, which ends the window (a trace). `ramp_s` is a closed loop's ramp-up."""
    if isinstance(load, Concurrency):
        await closed_loop(start, cursor, load.n, stop, ramp_s=ramp_s)
        return False
    await open_loop(start, schedule(load, cursor, arrivals), stop, max_inflight=max_inflight, clock=clock)
    return True
