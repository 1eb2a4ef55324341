"""The grid: the product of every axis, each point's vLLM flags, id and fingerprint."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from planner.sweep.config import SweepSettings
from planner.vllm_args import config_key
from replay.results import KEYS_OF_OLDER_FILES

MAIN_AXES = ("max_model_len", "gpu_memory_utilization", "tensor_parallel_size")
_SHORT = {"max_model_len": "mml", "gpu_memory_utilization": "gmu", "tensor_parallel_size": "tp"}


def flag_name(key: str) -> str:
    return "--" + key.strip("-").replace("_", "-")


@dataclass(frozen=True)
class Point:
    index: int
    id: str
    # Axis values by flag name in underscore form; env axes under "env".
    config: dict[str, Any]
    flags: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """Tensor x pipeline parallel size ([server] args may not set either, so the grid knows)."""
        return int(self.config.get("tensor_parallel_size") or 1) * int(self.config.get("pipeline_parallel_size") or 1)

    @property
    def nnodes(self) -> int:
        """The nodes vLLM spreads the point over ([grid.extra] nnodes; 1: one node)."""
        return int(self.config.get("nnodes") or 1)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nnodes


def _flags_for(key: str, value: Any) -> list[str]:
    name = flag_name(key)
    if value is True:
        return [name]
    if value is False:
        # vLLM's boolean flags come in --x / --no-x pairs.
        return ["--no-" + name[2:]]
    return [name, str(value)]


def _slug(value: Any) -> str:
    return str(value).replace("/", "_").replace(" ", "")


def expand(settings: SweepSettings) -> list[Point]:
    """Every combination of the axes, in the order the file lists them. Fixed [server] args go
    first in each command line and the point's flags after them."""
    grid = settings.grid
    axes: list[tuple[str, list[Any]]] = [(k, getattr(grid, k)) for k in MAIN_AXES if getattr(grid, k)]
    axes += [(config_key(k), v) for k, v in grid.extra.items()]
    env_axes = list(grid.env.items())
    varying = {name for name, values in axes if len(values) > 1} | {n for n, v in env_axes if len(v) > 1}
    names = [n for n, _ in axes]
    combos = itertools.product(*(v for _, v in axes), *(v for _, v in env_axes))
    points = []
    for index, combo in enumerate(combos, start=1):
        values = dict(zip(names, combo[: len(axes)]))
        env = {n: str(v) for (n, _), v in zip(env_axes, combo[len(axes):])}
        flags = [f for name, value in values.items() for f in _flags_for(name, value)]
        parts = [f"{_SHORT.get(n, n)}{_slug(v)}" for n, v in values.items() if n in varying]
        parts += [f"{n}={_slug(v)}" for n, v in env.items() if n in varying]
        point_id = f"{index:02d}" + ("-" + "-".join(parts) if parts else "")
        config = dict(values)
        if env:
            config["env"] = env
        points.append(Point(index=index, id=point_id, config=config, flags=flags, env=env))
    return points


def fingerprint(
    settings: SweepSettings, point: Point, *, corpus_sha256: str, vllm_version: str | None
) -> str:
    """What a result depends on; --resume reruns a point when any of it changed."""
    payload = {
        "model": settings.server.model,
        "vllm_version": vllm_version,
        "command": settings.server.command,
        "args": settings.server.args,
        "server_env": settings.server.env,
        "flags": point.flags,
        "env": point.env,
        "corpus_sha256": corpus_sha256,
        "slo": settings.slo.model_dump(mode="json"),
        # Keys added since, only when they differ from what results measured before them did
        # (KEYS_OF_OLDER_FILES): those results keep their fingerprints under the old values (the
        # file's order, no ramp-up), and are measured again under the new defaults.
        "replay": settings.replay.model_dump(
            mode="json",
            exclude={key for key, old in KEYS_OF_OLDER_FILES.items() if getattr(settings.replay, key) == old} or None,
        ),
        "client_cpus": settings.cpus.client,
    }
    if settings.sweep.server_starts != 1:
        # Only when set, so that results written before the key keep their fingerprints.
        payload["server_starts"] = settings.sweep.server_starts
    if settings.sweep.tie_break_starts:
        payload["tie_break_starts"] = settings.sweep.tie_break_starts
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
