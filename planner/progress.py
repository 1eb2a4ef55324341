"""A live progress line per step (measured/target, in flight, current p99 TTFT, when the step and
the search are expected to end), on stderr."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from replay.records import RequestRecord
from replay.results import LoadSpec, StepResult
from replay.search import binding as binding_mod

_LABELS = {"concurrency": "concurrency {v:g}", "rate": "rate {v:g}/s", "trace": "trace x{v:g}"}
# Recomputing a percentile on every request would cost more than the request at high rates.
_P99_EVERY_S = 0.5


class StepProgress:
    """Implements planner.sweep.observer.SweepObserver (and so replay.step.observer.ReplayObserver)."""

    def __init__(self, target_requests: int, *, prefix: str = "", console: Console | None = None) -> None:
        self._target = target_requests
        self._prefix = prefix
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("in flight {task.fields[inflight]:>4}  p99 TTFT {task.fields[p99]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._task = None
        self._inflight = 0
        self._ttft_ms: list[float] = []
        self._p99_at = 0.0
        self._search_eta_s: float | None = None
        self._measure_started: float | None = None
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
        self._parked[self._point] = (
            self._task, self._inflight, self._ttft_ms, self._p99_at, self._prefix, self._search_eta_s, self._measure_started
        )
        self._point = point_id
        (
            self._task, self._inflight, self._ttft_ms, self._p99_at, self._prefix, self._search_eta_s, self._measure_started
        ) = self._parked.pop(point_id, (None, 0, [], 0.0, f"{point_id}  ", None, None))

    # The sweep's point events: each step's line starts with the point it belongs to.
    def point_placed(self, point_id: str, node: str, gpu_model: str | None) -> None:
        """Where a point runs is the exporter's to show, not the progress line's."""

    def point_started(self, point_id: str, config: dict, model: str) -> None:
        self.set_prefix(f"{point_id}  ")

    def point_finished(
        self, point_id: str, safe_concurrency_per_gpu: float | None,
        knee_band_per_gpu: tuple[float | None, float | None] | None = None,
    ) -> None:
        self.set_prefix("")

    def step_started(self, load: LoadSpec) -> None:
        self._inflight = 0
        self._ttft_ms = []
        label = _LABELS[load.mode].format(v=load.value)
        self._measure_started = None
        self._task = self._progress.add_task(
            f"{self._prefix}{label}", total=self._target, inflight=0, p99="-", eta=self._eta_text(None)
        )

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        self._search_eta_s = search_eta_s

    def _eta_text(self, step_left_s: float | None) -> str:
        parts = []
        if step_left_s is not None:
            parts.append(f"step ends in ~{duration_text(step_left_s)}")
        if self._search_eta_s is not None:
            parts.append(f"search ~{duration_text(self._search_eta_s)} left")
        return "  ".join(parts)

    def request_sent(self) -> None:
        self._inflight += 1

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None:
        self._inflight -= 1
        now = time.monotonic()
        if measured and record.ttft_s is not None:
            self._ttft_ms.append(record.ttft_s * 1e3)
            if self._measure_started is None:
                self._measure_started = now
        fields: dict = {"inflight": self._inflight}
        if self._ttft_ms and now - self._p99_at > _P99_EVERY_S:
            self._p99_at = now
            fields["p99"] = f"{np.percentile(self._ttft_ms, 99):.0f} ms"
            # The step's expected end at the rate measured requests finish so far.
            spent = now - (self._measure_started or now)
            left = self._target - len(self._ttft_ms)
            rate = len(self._ttft_ms) / spent if spent > 0 else None
            fields["eta"] = self._eta_text(max(0.0, left / rate) if rate else None)
        self._progress.update(self._task, completed=min(len(self._ttft_ms), self._target), **fields)

    def step_finished(self, step: StepResult) -> None:
        if step.disturbed:
            # Something else ran: the step is measured again; the line says what it was.
            verdict = "DISTURBED (measured again): " + "; ".join(step.disturbed)
        elif step.slo_pass:
            verdict = "pass"
        elif step.slo_verdict == "unresolved":
            verdict = "UNRESOLVED (ran out of time)"
        else:
            verdict = "FAIL " + binding_mod.violations_text(step)
        p99 = step.ttft_ms.p99
        self._progress.update(
            self._task,
            completed=self._target,
            inflight=0,
            p99=f"{p99:.0f} ms  {verdict}" if p99 is not None else f"-  {verdict}",
            eta="",
        )


def duration_text(seconds: float) -> str:
    """12 s, 4 min 05 s, 2 h 10 min."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
