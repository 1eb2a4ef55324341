"""vLLM's own latency histograms over a step's window: the server's view beside the client's.

vLLM observes every request it serves into Prometheus histograms (time to first token, queue,
prefill, decode, ...). A snapshot of them at the window's start and one at its end give, as
their difference, what the engine measured for the requests of that window. Quantiles come from
the difference with PromQL's `histogram_quantile` interpolation, so they read the same as a
Grafana panel over the same interval, and each one carries the bucket it fell in: a p99 between
the 0.5 s and 0.75 s buckets is not a 1 ms figure.

Servers without these histograms (older vLLM, other OpenAI-compatible servers) give null figures
and a note, never an error. A counter that went down between the snapshots (a restarted server)
makes the whole window's server figures null, and the step says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from replay.results import ServerLatency

# Histogram families (names without _bucket/_sum/_count), in the order they are looked for.
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    # vLLM renamed the per-token histogram around 0.9; older servers only have the second name.
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
}
# Counter families (names without _total).
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens",),
    "generation_tokens": ("vllm:generation_tokens",),
    "requests_finished": ("vllm:request_success",),
    # Prompt tokens looked up in the prefix cache and found there (external_: a KV connector's
    # cache shared across instances; absent without one).
    "prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries",),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits",),
}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: `bounds` ascending upper bounds (the last is +Inf), `counts`
    the cumulative count at each bound."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    t_s: float
    histograms: dict[str, Histogram]
    counters: dict[str, float]
    # The earliest `_created` stamp of the chosen series: it changes when the server restarts.
    created: float | None
    model: str | None
    note: str | None = None


@dataclass
class WindowFigures:
    """What one window's snapshots give: quantiles per histogram, counter deltas, and why not."""

    latencies: dict[str, ServerLatency | None] = field(default_factory=dict)
    counters: dict[str, float | None] = field(default_factory=dict)
    counter_reset: bool = False
    note: str | None = None


def _wanted_family(name: str) -> tuple[str, str] | None:
    # The text parser returns a series' `_created` samples as a gauge family of their own.
    if name.endswith("_created") and _wanted_family(name.removesuffix("_created")) is not None:
        return "created", name.removesuffix("_created")
    for key, names in HISTOGRAMS.items():
        if name in names:
            return "histogram", key
    for key, names in COUNTERS.items():
        if name in names:
            return "counter", key
    return None


def parse_snapshot(text: str, t_s: float, model: str | None = None) -> Snapshot:
    """The histograms and counters of one /metrics text, for the served model.

    Several engines (data parallel) each export their own series: they are added up. When the
    text carries several `model_name` labels, `model` picks one; without a match the figures are
    left out with a note. Raises ValueError when the text is not Prometheus text.
    """
    # family name -> model_name label -> its samples
    found: dict[str, dict[str | None, list]] = {}
    kinds: dict[str, tuple[str, str]] = {}
    for family in text_string_to_metric_families(text):
        wanted = _wanted_family(family.name)
        if wanted is None:
            continue
        kinds[family.name] = wanted
        per_model = found.setdefault(family.name, {})
        for s in family.samples:
            per_model.setdefault(s.labels.get("model_name"), []).append(s)

    models = sorted(
        {m for name, per_model in found.items() if kinds[name][0] != "created" for m in per_model},
        key=lambda m: m or "",
    )
    if not models:
        return Snapshot(t_s, {}, {}, None, None, note="no vLLM latency histograms at /metrics")
    if model in models:
        chosen = model
    elif len(models) == 1:
        chosen = models[0]
    else:
        return Snapshot(
            t_s, {}, {}, None, None,
            note=f"/metrics has several models ({', '.join(str(m) for m in models)}) and none is the served one ({model})",
        )

    def samples_of(names: tuple[str, ...]) -> list | None:
        # The first name of the table that the server exports wins (the new ITL name over the old).
        return next((found[n][chosen] for n in names if found.get(n, {}).get(chosen)), None)

    counters: dict[str, float] = {}
    for key, names in COUNTERS.items():
        samples = samples_of(names)
        if samples is not None:
            counters[key] = sum(s.value for s in samples if s.name.endswith("_total"))
    histograms: dict[str, Histogram] = {}
    for key, names in HISTOGRAMS.items():
        samples = samples_of(names)
        histogram = _histogram(samples) if samples is not None else None
        if histogram is not None:
            histograms[key] = histogram
    created = [s.value for name, per_model in found.items() if kinds[name][0] == "created" for s in per_model.get(chosen, [])]
    return Snapshot(t_s, histograms, counters, min(created) if created else None, chosen)


def histogram_quantile(q: float, bounds: tuple[float, ...], counts: tuple[float, ...]) -> tuple[float, float, float] | None:
    """PromQL's histogram_quantile on cumulative buckets: (value, bucket lower, bucket upper).

    Linear interpolation inside the bucket the rank falls in; the lowest bucket starts at 0 (when
    its bound is positive); a rank in the +Inf bucket returns the highest finite bound, with
    +Inf as the upper end of its bucket. None when there are no observations.
    """
    if len(bounds) < 2 or not counts or counts[-1] <= 0:
        return None
    # Prometheus forces the counts monotonic first (scrapes are not atomic).
    mono = []
    for c in counts:
        mono.append(max(c, mono[-1]) if mono else c)
    observations = mono[-1]
    rank = q * observations
    b = next(i for i, c in enumerate(mono) if c >= rank)
    lower = bounds[b - 1] if b > 0 else 0.0
    if b == len(bounds) - 1:
        return bounds[-2], bounds[-2], bounds[-1]
    if b == 0 and bounds[0] <= 0:
        return bounds[0], bounds[0], bounds[0]
    count = mono[b] - (mono[b - 1] if b > 0 else 0.0)
    below = mono[b - 1] if b > 0 else 0.0
    return lower + (bounds[b] - lower) * ((rank - below) / count), lower, bounds[b]


def latency_ms(h: Histogram) -> ServerLatency:
    """Quantiles (PromQL interpolation) and mean of a histogram of seconds, in milliseconds."""
    figures: dict[str, object] = {"count": h.count}
    if h.count > 0:
        figures["mean"] = h.sum / h.count * 1e3
    for name, q in QUANTILES.items():
        r = histogram_quantile(q, h.bounds, h.counts)
        if r is None:
            continue
        value, lower, upper = r
        figures[name] = value * 1e3
        # JSON has no infinity: an open upper end is null.
        figures[f"{name}_bucket_ms"] = (lower * 1e3, None if math.isinf(upper) else upper * 1e3)
    return ServerLatency(**figures)


def _went_down(start: Histogram, end: Histogram) -> bool:
    return end.count < start.count or end.sum < start.sum or any(e < s for s, e in zip(start.counts, end.counts))


def window_figures(start: Snapshot | None, end: Snapshot | None) -> WindowFigures:
    """The differences between a window's two snapshots, as server figures."""
    if start is None or end is None:
        which = "start" if start is None else "end"
        return WindowFigures(note=f"no /metrics snapshot at the window's {which}")
    note = end.note or start.note
    if note:
        return WindowFigures(note=note)
    if start.model != end.model:
        return WindowFigures(note=f"the server's model changed during the window ({start.model} -> {end.model})")
    restarted = start.created is not None and end.created is not None and end.created != start.created
    went_down = any(_went_down(start.histograms[k], h) for k, h in end.histograms.items() if k in start.histograms)
    went_down |= any(v < start.counters[k] for k, v in end.counters.items() if k in start.counters)
    if restarted or went_down:
        return WindowFigures(
            counter_reset=True,
            note="vLLM's counters went back during the window (the server restarted?): no server latency figures",
        )
    out = WindowFigures()
    missing = []
    for key in HISTOGRAMS:
        s, e = start.histograms.get(key), end.histograms.get(key)
        if s is None or e is None or s.bounds != e.bounds:
            out.latencies[key] = None
            missing.append(key)
            continue
        delta = Histogram(e.bounds, tuple(b - a for a, b in zip(s.counts, e.counts)), e.sum - s.sum, e.count - s.count)
        out.latencies[key] = latency_ms(delta)
    for key in COUNTERS:
        s_c, e_c = start.counters.get(key), end.counters.get(key)
        out.counters[key] = None if s_c is None or e_c is None else e_c - s_c
    if missing:
        out.note = f"no vLLM histogram at /metrics for {', '.join(missing)}"
    return out


def _histogram(samples: list) -> Histogram | None:
    """One histogram from its samples, engines added up; None when it is not usable (no +Inf
    bucket): as if absent."""
    buckets: dict[float, float] = {}
    total_sum = total_count = 0.0
    for s in samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
        elif s.name.endswith("_sum"):
            total_sum += s.value
        elif s.name.endswith("_count"):
            total_count += s.value
    bounds = tuple(sorted(buckets))
    if not bounds or not math.isinf(bounds[-1]):
        return None
    return Histogram(bounds, tuple(buckets[b] for b in bounds), total_sum, total_count)
