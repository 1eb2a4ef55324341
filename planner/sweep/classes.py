"""Speed classes: the points of a grid that share one latency law.

The assumption: some vLLM flags change only how much memory the engine holds (the KV pool, the
longest request, how many requests it admits), never how long one engine step takes at a given
batch. Two points that differ only in such flags run the same batch at the same speed, so every
SLO figure against requests running is one law for both: they form one class, and the other
flags (and env axes) name it. max_num_seqs is among them as a cap: it limits how many requests
run, not how fast a batch of a given size runs. Unless set, [sweep] memory_only_flags is
DEFAULT_MEMORY_ONLY_FLAGS (planner.sweep.config).

The adaptive strategy (planner.sweep.adaptive) relies on this assumption and checks it: every
prediction it acts on is verified on the point itself, and a verification that disagrees falls
back to a full search of that point.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.sweep.config import DEFAULT_MEMORY_ONLY_FLAGS
from planner.sweep.grid import Point
from planner.vllm_args import config_key

__all__ = ["DEFAULT_MEMORY_ONLY_FLAGS", "SpeedClass", "class_key", "class_of", "speed_classes"]


@dataclass(frozen=True)
class SpeedClass:
    # c1, c2, ... in the order the grid first reaches each class.
    id: str
    # The axis values that name the class, those that vary over the grid (flags in underscore
    # form; env axes as "env NAME").
    key: tuple[tuple[str, str], ...]
    point_ids: tuple[str, ...]

    def label(self) -> str:
        if not self.key:
            return "every point"
        return ", ".join(f"{name}={value}" for name, value in self.key)


def class_key(point: Point, memory_only: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The point's axis values outside the memory-only flags: what its speed depends on."""
    memory = {config_key(f) for f in memory_only}
    key = [(name, repr(value)) for name, value in point.config.items() if name != "env" and name not in memory]
    key += [(f"env {name}", repr(value)) for name, value in point.env.items()]
    return tuple(sorted(key))


def speed_classes(points: Sequence[Point], memory_only: Iterable[str]) -> list[SpeedClass]:
    """The grid's classes, in the order the grid first reaches each; a class lists its points in
    grid order."""
    memory = tuple(memory_only)
    members: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for point in points:
        members.setdefault(class_key(point, memory), []).append(point.id)
    # An axis with one value splits nothing: the label names only the axes that vary.
    values: dict[str, set[str]] = {}
    for key in members:
        for name, value in key:
            values.setdefault(name, set()).add(value)
    varying = {name for name, seen in values.items() if len(seen) > 1}
    return [
        SpeedClass(id=f"c{i}", key=tuple((n, _shown(v)) for n, v in key if n in varying), point_ids=tuple(ids))
        for i, (key, ids) in enumerate(members.items(), start=1)
    ]


def class_of(points: Sequence[Point], memory_only: Iterable[str]) -> dict[str, SpeedClass]:
    """Each point's class, by point id."""
    return {pid: c for c in speed_classes(points, memory_only) for pid in c.point_ids}


def _shown(value_repr: str) -> str:
    # Strings keep no quotes in a label: kv_cache_dtype=fp8, not kv_cache_dtype='fp8'.
    return value_repr[1:-1] if len(value_repr) >= 2 and value_repr[0] == value_repr[-1] == "'" else value_repr
