"""Load patterns: when requests are sent.

Closed-loop concurrency keeps N requests in flight; open-loop Poisson sends at seeded exponential
inter-arrival times; trace replay sends at the corpus's `timestamp_s`, sped up by a factor. The
open-loop schedules are plain generators of offsets in seconds from the start of the step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from replay.results import LoadSpec


@dataclass(frozen=True)
class Concurrency:
    n: int

    def spec(self) -> LoadSpec:
        return LoadSpec(mode="concurrency", value=self.n)

    def label(self) -> str:
        return f"concurrency {self.n}"


@dataclass(frozen=True)
class PoissonRate:
    rate_per_s: float
    seed: int

    def spec(self) -> LoadSpec:
        return LoadSpec(mode="rate", value=self.rate_per_s, seed=self.seed)

    def label(self) -> str:
        return f"rate {self.rate_per_s:g}/s"


@dataclass(frozen=True)
class TraceReplay:
    speed: float = 1.0

    def spec(self) -> LoadSpec:
        return LoadSpec(mode="trace", value=self.speed)

    def label(self) -> str:
        return f"trace x{self.speed:g}"


Load = Concurrency | PoissonRate | TraceReplay


def poisson_offsets(rate_per_s: float, seed: int) -> Iterator[float]:
    """Arrival offsets of a Poisson process; the same seed gives the same schedule."""
    if rate_per_s <= 0:
        raise ValueError("rate must be > 0")
    rng = np.random.default_rng(seed)
    t = 0.0
    while True:
        # Draw in blocks: one numpy call per 1024 arrivals keeps the dispatcher cheap at high rates.
        for gap in rng.exponential(1.0 / rate_per_s, size=1024):
            t += float(gap)
            yield t


def trace_offsets(timestamps_s: Sequence[float], speed: float) -> list[tuple[float, int]]:
    """(offset, corpus index) in arrival order, the first arrival at offset 0."""
    if speed <= 0:
        raise ValueError("speed must be > 0")
    order = sorted(range(len(timestamps_s)), key=lambda i: timestamps_s[i])
    if not order:
        return []
    t0 = timestamps_s[order[0]]
    return [((timestamps_s[i] - t0) / speed, i) for i in order]
