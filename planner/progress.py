"""A live progress line per step (measured/target, in flight, current p99 TTFT), on stderr."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from replay.records import RequestRecord
from replay.results import LoadSpec, StepResult

_LABELS = {"concurrency": "concurrency {v:g}", "rate": "rate {v:g}/s", "trace": "trace x{v:g}"}
# Recomputing a percentile on every request would cost more than the request at high rates.
_P99_EVERY_S = 0.5


class StepProgress:
    """Implements planner.sweep.observer.SweepObserver (and so replay.observer.ReplayObserver)."""

    def __init__(self, target_requests: int, *, prefix: str = "", console: Console | None = None) -> None:
        self._target = target_requests
        self._prefix = prefix
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("in flight {task.fields[inflight]:>4}  p99 TTFT {task.fields[p99]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._task = None
        self._inflight = 0
        self._ttft_ms: list[float] = []
        self._p99_at = 0.0
        # Other points' step state, while their events interleave with this one's (a cluster sweep).
        self._point: str | None = None
        self._parked: dict[str | None, tuple] = {}

    def __enter__(self) -> StepProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def set_prefix(self, prefix: str) -> None:
        self._prefix = prefix

    def use_point(self, point_id: str) -> None:
        """The point the next calls belong to: each point keeps its own step line."""
        if point_id == self._point:
            return
        self._parked[self._point] = (self._task, self._inflight, self._ttft_ms, self._p99_at, self._prefix)
        self._point = point_id
        self._task, self._inflight, self._ttft_ms, self._p99_at, self._prefix = self._parked.pop(
            point_id, (None, 0, [], 0.0, f"{point_id}  ")
        )

    # The sweep's point events: each step's line starts with the point it belongs to.
    def point_placed(self, point_id: str, node: str, gpu_model: str | None) -> None:
        """Where a point runs is the exporter's to show, not the progress line's."""

    def point_started(self, point_id: str, config: dict, model: str) -> None:
        self.set_prefix(f"{point_id}  ")

    def point_finished(self, point_id: str, safe_concurrency_per_gpu: float | None) -> None:
        self.set_prefix("")

    def step_started(self, load: LoadSpec) -> None:
        self._inflight = 0
        self._ttft_ms = []
        label = _LABELS[load.mode].format(v=load.value)
        self._task = self._progress.add_task(
            f"{self._prefix}{label}", total=self._target, inflight=0, p99="-"
        )

    def request_sent(self) -> None:
        self._inflight += 1

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None:
        self._inflight -= 1
        if measured and record.ttft_s is not None:
            self._ttft_ms.append(record.ttft_s * 1e3)
        fields = {"inflight": self._inflight}
        now = time.monotonic()
        if self._ttft_ms and now - self._p99_at > _P99_EVERY_S:
            self._p99_at = now
            fields["p99"] = f"{np.percentile(self._ttft_ms, 99):.0f} ms"
        self._progress.update(self._task, completed=min(len(self._ttft_ms), self._target), **fields)

    def step_finished(self, step: StepResult) -> None:
        verdict = "pass" if step.slo_pass else "FAIL " + ",".join(step.slo_violations)
        p99 = step.ttft_ms.p99
        self._progress.update(
            self._task,
            completed=self._target,
            inflight=0,
            p99=f"{p99:.0f} ms  {verdict}" if p99 is not None else f"-  {verdict}",
        )
