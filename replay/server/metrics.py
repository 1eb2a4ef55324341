"""Scrape a server's /metrics while a step runs and keep what capacity planning needs.

vLLM's metric names are declared as data; a server without them (another OpenAI-compatible
server, or vLLM with --disable-log-stats) is fine and is said so in the results.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from replay.results import ServerSummary
from replay.server.histograms import Snapshot, parse_snapshot, window_figures

# Sample names as they appear in the exposition text (counters carry their _total suffix).
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
PREEMPTIONS = ("vllm:num_preemptions_total",)


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float
    kv_cache_usage: float | None
    running: float | None
    waiting: float | None
    preemptions: float | None
    # When the scrape was sent (None: at t_s). The server read its figures between the two, so a
    # scrape sent as the window closed speaks for its end however long a busy server took to answer.
    sent_s: float | None = None

    @property
    def asked_s(self) -> float:
        return self.t_s if self.sent_s is None else self.sent_s


def parse_sample(text: str, t_s: float, sent_s: float | None = None) -> Sample | None:
    """One scrape; None when the text carries no vLLM metric at all."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:"):
                values.setdefault(s.name, []).append(float(s.value))
    if not values:
        return None

    def pick(names: tuple[str, ...], combine: Callable[[list[float]], float]) -> float | None:
        for name in names:
            if name in values:
                return combine(values[name])
        return None

    # Several engines (data parallel) each report their own series: usage is the worst engine,
    # request counts and preemptions add up.
    return Sample(
        t_s=t_s,
        kv_cache_usage=pick(KV_CACHE_USAGE, max),
        running=pick(RUNNING, sum),
        waiting=pick(WAITING, sum),
        preemptions=pick(PREEMPTIONS, sum),
        sent_s=sent_s,
    )


def summarize(
    samples: list[Sample], window_start_s: float, window_end_s: float, note: str | None, *,
    max_edge_gap_s: float | None = None, marks: tuple[float, float] | None = None,
) -> ServerSummary:
    """Peaks over the window; preemptions as the counter's change across it.

    The last sample before the window opens is the counter's baseline, so preemptions that
    happened during warm-up are not charged to the window. A sample outside the window counts
    only within `max_edge_gap_s` of its edge: the scrape before a long warm-up, or after the
    drain, says nothing of the window; a sample answered after the close speaks for it when it was
    asked for within `max_edge_gap_s` of it. When no sample is inside or near the window, the peaks
    are unknown (None, `window_sampled` false, and the note says why), never read as 0; when the
    counter's reads do not reach both edges, so are the preemptions (`_counter_change`). `marks`:
    when the scrapes asked for as the window opened and closed were answered (its histograms'
    edges); each counts as reaching its edge however late the client's loop could ask for it.
    """
    if not samples:
        return ServerSummary(metrics_available=False, metrics_note=note or "no vllm:* metrics at /metrics")
    before = [s for s in samples if s.t_s <= window_start_s]
    after = [s for s in samples if s.t_s >= window_end_s]
    # From the last sample before the window to the first one after it, so a window shorter
    # than the scrape interval still has samples around it.
    first_t = before[-1].t_s if before else samples[0].t_s
    last_t = after[0].t_s if after else samples[-1].t_s
    if max_edge_gap_s is not None:
        first_t = max(first_t, window_start_s - max_edge_gap_s)
        # A sample after the close speaks for it when it was asked for near the close (the
        # window's "end" mark is asked for at the close, and may be answered seconds later).
        near = [s for s in after if s.asked_s <= window_end_s + max_edge_gap_s]
        last_t = near[0].t_s if near else min(last_t, window_end_s + max_edge_gap_s)
        if marks is not None:
            # The closing mark, however late a starved client loop asked for it.
            last_t = max(last_t, marks[1])
    considered = [s for s in samples if first_t <= s.t_s <= last_t]
    if not considered:
        return ServerSummary(
            metrics_available=True,
            metrics_note=_unsampled_note(samples, window_start_s, window_end_s, max_edge_gap_s, note),
            window_sampled=False,
        )

    def peak(attr: str) -> float | None:
        vals = [getattr(s, attr) for s in considered if getattr(s, attr) is not None]
        return max(vals) if vals else None

    preemptions, seen, counter_note = _counter_change(
        considered, window_start_s, window_end_s, max_edge_gap_s or 0.0, marks
    )
    if counter_note is not None:
        note = f"{counter_note}; {note}" if note else counter_note
    return ServerSummary(
        metrics_available=True,
        metrics_note=note,
        samples=len(considered),
        kv_cache_usage_peak=peak("kv_cache_usage"),
        preemptions=preemptions,
        preemptions_at_least=seen,
        running_peak=peak("running"),
        waiting_peak=peak("waiting"),
    )


def _counter_change(
    considered: list[Sample], start_s: float, end_s: float, tolerance_s: float,
    marks: tuple[float, float] | None = None,
) -> tuple[float | None, float | None, str | None]:
    """The preemption counter's change across the window: (exact count, lower bound, note).

    A counter's change is exact between its first and last read. Those reach the window's edges
    when they lie within `tolerance_s` of them, or are the scrapes asked for as the window opened
    and closed (`marks`, when they were answered: the edges vLLM's histograms are read at; a
    client loop starved of CPU asks for them late). Otherwise what happened between the reads is
    only a lower bound of the window's count: the count is then unknown (None), the bound is
    kept, and the note says so, so that a scrape that missed an edge never reads as 0 preemptions.
    """
    counted = [s for s in considered if s.preemptions is not None]
    if not counted:
        return None, None, None
    first, last = counted[0], counted[-1]
    change = max(0.0, float(last.preemptions) - float(first.preemptions))
    opened = first.asked_s <= start_s + tolerance_s or (marks is not None and first.t_s <= marks[0])
    closed = last.t_s >= end_s - tolerance_s or (marks is not None and last.t_s >= marks[1])
    if opened and closed:
        return change, None, None
    note = (
        f"vllm:num_preemptions_total was read only from {first.asked_s - start_s:.1f} s to {last.t_s - start_s:.1f} s"
        f" of the {end_s - start_s:.1f} s window ({change:g} preemptions then): the window's count is unknown"
    )
    return None, change, note


def _unsampled_note(
    samples: list[Sample], start_s: float, end_s: float, max_edge_gap_s: float | None, note: str | None
) -> str:
    before = [s.t_s for s in samples if s.t_s < start_s]
    after = [s.t_s for s in samples if s.t_s > end_s]
    nearest = []
    if before:
        nearest.append(f"{start_s - before[-1]:.1f} s before it")
    if after:
        nearest.append(f"{after[0] - end_s:.1f} s after it")
    text = (
        f"no /metrics sample inside the {end_s - start_s:.1f} s window or within {max_edge_gap_s:.1f} s of it"
        f" (the nearest: {' and '.join(nearest) or 'none'}): the window's gauges and preemptions are unknown"
    )
    return f"{text}; {note}" if note else text


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    """Hit tokens over queried tokens in a window; None when not exported or nothing was queried."""
    if hits is None or not queries:
        return None
    return round(hits / queries, 4)


@dataclass
class MetricsScraper:
    """Polls `fetch()` about every `interval_s` until stopped; keeps every sample."""

    fetch: Callable[[], Awaitable[str | None]]
    interval_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    note: str | None = None
    # The served model: picks vLLM's series when /metrics carries several model_name labels.
    model: str | None = None
    # Histogram snapshots taken on demand (`mark`), by label ("start", "end" of the window).
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    # The fetch for those snapshots (None: `fetch`): the window's edges are worth a longer wait
    # than a periodic scrape, since the counters' changes across the window are read from them.
    fetch_mark: Callable[[], Awaitable[str | None]] | None = None
    snapshot_notes: dict[str, str] = field(default_factory=dict)
    _marks: list[asyncio.Task] = field(default_factory=list)
    _task: asyncio.Task | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def edge_gap_s(self) -> float:
        """How far outside a window a sample may lie and still speak for its edge: two scrape
        intervals, and never under a second (a /metrics answer on a busy server takes a while)."""
        return max(2 * self.interval_s, 1.0)

    def mark(self, label: str) -> None:
        """Scrape now, through the same fetch as the periodic scrapes, and keep the histograms
        under `label`; the periodic samples get this scrape too. Call from the event loop."""
        self._marks.append(asyncio.create_task(self._snapshot(label), name=f"metrics-snapshot-{label}"))

    async def _snapshot(self, label: str) -> None:
        sent_s = time.perf_counter()
        try:
            text = await (self.fetch_mark or self.fetch)()
        except Exception as exc:  # as for the periodic scrapes: noted, never fatal
            self.snapshot_notes[label] = f"scraping /metrics failed: {type(exc).__name__}: {exc}"
            return
        # Stamped when the answer arrived: a request's last chunk and the /metrics answer leave
        # the same server and reach the same client loop, so the two keep their order. The
        # client's count of finished requests is taken between these two stamps.
        t_s = time.perf_counter()
        if text is None:
            self.snapshot_notes[label] = "the server has no /metrics endpoint"
            return
        try:
            self.snapshots[label] = parse_snapshot(text, t_s, self.model)
            sample = parse_sample(text, t_s, sent_s)
        except ValueError as exc:
            self.snapshot_notes[label] = f"/metrics is not Prometheus text: {exc}"
            return
        if sample is not None:
            self.samples.append(sample)
            self.samples.sort(key=lambda s: s.t_s)

    def window_histograms(self) -> dict[str, object]:
        """ServerSummary fields from the "start" and "end" snapshots."""
        start, end = self.snapshots.get("start"), self.snapshots.get("end")
        figures = window_figures(start, end)
        note = figures.note
        if start is None or end is None:
            note = self.snapshot_notes.get("start" if start is None else "end") or note
        return {
            **{f"{key}_ms": value for key, value in figures.latencies.items()},
            **figures.counters,
            "prefix_cache_hit_rate": hit_rate(figures.counters.get("prefix_cache_hits"), figures.counters.get("prefix_cache_queries")),
            "external_prefix_cache_hit_rate": hit_rate(
                figures.counters.get("external_prefix_cache_hits"), figures.counters.get("external_prefix_cache_queries")
            ),
            "counter_reset": figures.counter_reset,
            "histograms_note": note,
        }

    async def scrape_once(self) -> None:
        sent_s = time.perf_counter()
        try:
            text = await self.fetch()
        except Exception as exc:  # a failed scrape must never fail the step; it is noted
            self.note = f"scraping /metrics failed: {type(exc).__name__}: {exc}"
            return
        if text is None:
            self.note = self.note or "the server has no /metrics endpoint"
            return
        try:
            sample = parse_sample(text, time.perf_counter(), sent_s)
        except ValueError as exc:
            self.note = f"/metrics is not Prometheus text: {exc}"
            return
        if sample is None:
            self.note = self.note or "no vllm:* metrics at /metrics"
            return
        self.samples.append(sample)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            await self.scrape_once()
            try:
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)
            except TimeoutError:
                pass

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="metrics-scraper")

    async def stop(self, *, cancel_marks: bool = False) -> None:
        """Stop scraping, once the window's marks are in (`fetch_mark` may wait long for a busy
        server's answer) and with one last scrape; `cancel_marks`: the server hung or is gone (the
        step was aborted or cancelled) and no answer will come, so every scrape in flight is
        dropped and no last one is taken. Waiting for them would hold a hung point for the marks'
        30 s time-out, past the liveness watch's bound."""
        self._stopping.set()
        if cancel_marks:
            for task in (self._task, *self._marks):
                if task is not None:
                    task.cancel()
        pending = [t for t in (self._task, *self._marks) if t is not None]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if not cancel_marks:
            # One last scrape so the window's end has a sample of its own.
            await self.scrape_once()
