"""The seam through which a replay reports progress as it happens (the exporter, the progress bar).

Observers are called from the replay's event loop and must not block.
"""

from __future__ import annotations

from typing import Protocol

from replay.records import RequestRecord
from replay.results import LoadSpec, StepResult


class ReplayObserver(Protocol):
    def step_started(self, load: LoadSpec) -> None: ...

    def request_sent(self) -> None: ...

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None: ...

    def step_finished(self, step: StepResult) -> None: ...

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        """The search chose its next step; `search_eta_s` estimates the rest of it (replay.search.eta)."""


class Observers:
    """Fans every call out to several observers."""

    def __init__(self, *observers: ReplayObserver) -> None:
        self._observers = [o for o in observers if o is not None]

    def step_started(self, load: LoadSpec) -> None:
        for o in self._observers:
            o.step_started(load)

    def request_sent(self) -> None:
        for o in self._observers:
            o.request_sent()

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None:
        for o in self._observers:
            o.request_finished(record, measured=measured)

    def step_finished(self, step: StepResult) -> None:
        for o in self._observers:
            o.step_finished(step)

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        for o in self._observers:
            o.probe_planned(concurrency, search_eta_s)
