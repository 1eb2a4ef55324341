"""The results schema (replay.json) and its atomic writer.

Every figure carries its unit in its name. Results are pure data: reports and plots are rebuilt
from them without a server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from replay.atomic import atomic_text
from replay.environment import StepEnvironment
from replay.identity import Identity

# 2: `identity`, what the run measured (replay.identity); version 1 files load without it.
SCHEMA_VERSION = 2

LoadMode = Literal["concurrency", "rate", "trace"]
# unresolved: the window ran out of time before its bounds were finite (see replay.step).
Verdict = Literal["pass", "fail", "inconclusive", "unresolved"]


class _Model(BaseModel):
    # Results files are read back by `planner report`; tolerate fields added by later versions.
    model_config = ConfigDict(extra="ignore")


class LatencySummary(_Model):
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    # 95% intervals in arrival order (see replay.intervals): {"mean": [lo, hi], "p50": [lo, hi], ...};
    # a side is null where the sample is too small for a finite bound; absent in older files.
    ci95: dict[str, list[float | None]] | None = None


class LoadSpec(_Model):
    mode: LoadMode
    # concurrency: requests in flight; rate: requests per second; trace: speed factor
    value: float
    seed: int | None = None


class ServerLatency(_Model):
    """One of vLLM's latency histograms over the window (its delta), in milliseconds.

    Quantiles use PromQL's histogram_quantile interpolation; `<q>_bucket_ms` is the bucket
    [lower, upper] each fell in (upper null: above the highest finite bucket), the figure's
    resolution. `count` is the number of observations in the window.
    """

    count: float = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p50_bucket_ms: tuple[float, float | None] | None = None
    p90_bucket_ms: tuple[float, float | None] | None = None
    p95_bucket_ms: tuple[float, float | None] | None = None
    p99_bucket_ms: tuple[float, float | None] | None = None


class ServerSummary(_Model):
    metrics_available: bool = False
    # Why metrics are missing, when they are ("no vllm:* metrics at /metrics", "HTTP 404", ...).
    metrics_note: str | None = None
    samples: int = 0
    # False when /metrics answered during the step but no sample fell inside the window or near
    # its edges (a scrape stalled on a busy server): the gauges' peaks are then unknown (null).
    window_sampled: bool = True
    kv_cache_usage_peak: float | None = None
    preemptions: float | None = None
    running_peak: float | None = None
    waiting_peak: float | None = None
    # vLLM's own latency histograms over the window (null: not exported, or counters reset).
    ttft_ms: ServerLatency | None = None
    itl_ms: ServerLatency | None = None
    tpot_ms: ServerLatency | None = None
    e2e_ms: ServerLatency | None = None
    queue_ms: ServerLatency | None = None
    prefill_ms: ServerLatency | None = None
    decode_ms: ServerLatency | None = None
    # Counter deltas over the window.
    requests_finished: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    # vLLM's prefix cache over the window: prompt tokens looked up and found (vllm:prefix_cache_*),
    # and hits / queries; external_: a KV connector's cross-instance cache, when it has one.
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None
    external_prefix_cache_queries: float | None = None
    external_prefix_cache_hits: float | None = None
    external_prefix_cache_hit_rate: float | None = None
    # A counter went back between the window's snapshots (a restarted server).
    counter_reset: bool = False
    # Why some or all histogram figures are missing.
    histograms_note: str | None = None


class ClientSummary(_Model):
    # Open-loop loads: how late requests left against their schedule.
    send_lag_p99_ms: float | None = None
    # How late the event loop woke against a 10 ms ticker, for every load mode.
    loop_lag_p99_ms: float | None = None
    client_limited: bool = False
    note: str | None = None
    # Requests the client saw finish between the server's two /metrics snapshots (at the window's
    # open and close; the window itself without them), to compare with the server's count.
    requests_finished: int | None = None
    # Client minus server (vLLM's histograms) over the same window.
    ttft_mean_minus_server_ms: float | None = None
    tpot_mean_minus_server_ms: float | None = None
    requests_minus_server: float | None = None
    # The client's TTFT exceeds the server's by more than the threshold: the client side
    # (its machine, its event loop, the network), not the engine, added that latency.
    client_or_network_latency: bool = False
    latency_note: str | None = None
    # Chunks that arrived together (their gap below the clock's resolution): left out of ITL.
    itl_bursts: int = 0
    itl_burst_gaps: int = 0
    # Connects tried again by the measured requests before their connection opened (each waited
    # for it, inside its latency); a connect that failed every try is an error of kind "connect".
    connect_retries: int = 0


class TurnLatency(_Model):
    """One turn number's figures over a step's measured session turns."""

    count: int
    ttft_ms: LatencySummary
    e2e_ms: LatencySummary
    # Mean prompt tokens sent at this turn (the server's usage), and of them the history resent
    # (the previous turn's prompt plus its output); null where the server sent no usage.
    prompt_tokens_mean: float | None = None
    resent_tokens_mean: float | None = None


class SessionSummary(_Model):
    """A session corpus's step: users (sessions in flight) against requests in flight, both
    time-weighted over the window, and what completed inside it."""

    sessions_in_flight_mean: float | None = None
    sessions_in_flight_peak: int | None = None
    requests_in_flight_mean: float | None = None
    requests_in_flight_peak: int | None = None
    sessions_started: int = 0
    sessions_completed: int = 0
    turns_completed: int = 0
    # Keyed by turn number ("1", "2", ...): the cost of a growing context.
    by_turn: dict[str, TurnLatency] = Field(default_factory=dict)
    # Prompt tokens that were history resent, over the window's completed turns (null: no usage).
    resent_tokens: int | None = None


class SloExceedance(_Model):
    """The order-statistic test that passed a percentile rule (replay.binding): `exceeded` of the
    `n` measured requests were above the bound, and the test allows at most `allowed` (it counts
    on `effective_n` independent requests, n shrunk by their correlation)."""

    exceeded: int
    n: int
    allowed: int
    effective_n: int | None = None


class StepResult(_Model):
    load: LoadSpec
    started_at: str
    warmup_requests: int
    window_s: float
    requests_ok: int
    requests_failed: int
    # Still running when the window closed: finished but not counted.
    requests_drained: int = 0
    errors: dict[str, int] = Field(default_factory=dict)
    error_samples: dict[str, str] = Field(default_factory=dict)
    ttft_ms: LatencySummary
    itl_ms: LatencySummary
    tpot_ms: LatencySummary
    e2e_ms: LatencySummary
    requests_per_s: float
    input_tokens_per_s: float | None
    output_tokens_per_s: float
    # "usage" when every counted request carried a usage chunk; "chunks" when the server sent
    # none and tokens were counted as content chunks; "mixed" otherwise.
    tokens_source: Literal["usage", "chunks", "mixed", "none"]
    server: ServerSummary
    client: ClientSummary
    slo_pass: bool
    slo_violations: list[str] = Field(default_factory=list)
    # SLOs that could not be checked (no vLLM metrics for max_preemptions, ...).
    slo_unverified: list[str] = Field(default_factory=list)
    # The view each SLO was judged on: "client" (the replay's records) or "server" (vLLM's metrics).
    slo_views: dict[str, str] = Field(default_factory=dict)
    # Three-valued SLO verdicts (pass: the whole 95% interval meets the bound; fail: it breaks it;
    # inconclusive: otherwise). slo_pass is true only for "pass"; absent in older files.
    slo_verdict: Verdict | None = None
    slo_verdicts: dict[str, Verdict] = Field(default_factory=dict)
    # Each client-side percentile rule that passed: the exceedance test that passed it (shown
    # beside an interval that is open above). Absent in older files.
    slo_exceedance: dict[str, SloExceedance] = Field(default_factory=dict)
    requests_per_s_ci95: list[float | None] | None = None
    output_tokens_per_s_ci95: list[float | None] | None = None
    # Measured requests that met every per-request latency bound (see replay.slo.per_request_bounds).
    slo_attainment: float | None = None
    slo_attainment_ci95: list[float | None] | None = None
    goodput_requests_per_s: float | None = None
    # Early measured requests dropped as not yet in steady state (replay.steady).
    steady_state_dropped: int = 0
    # What closed the window: requests (its minimum or maximum), verdict (conclusive early),
    # time (its limit), budget (the point's), stall (the warm-up never finished), trace_end, abort.
    window_closed_by: str | None = None
    # The window's time limit (max_window_s, or sized from the warm-up), and the warm-up's mean
    # request duration it was sized from.
    window_limit_s: float | None = None
    request_duration_s: float | None = None
    # Filled in by planner sweep: peak used memory per GPU during the step.
    gpu_memory_peak_mib: dict[str, float] | None = None
    # What else the machine did during the window (replay.environment), and what disturbed the
    # step: one phrase per cause; a disturbed step carries no information (the search measures
    # it again). Absent in older files and where nothing was watched.
    environment: StepEnvironment | None = None
    disturbed: list[str] = Field(default_factory=list)
    # Session corpora only: the load's value counts sessions (users); this says how they mapped
    # to requests in flight, and the per-turn figures. Absent for plain corpora and older files.
    sessions: SessionSummary | None = None


class CorpusInfo(_Model):
    path: str
    sha256: str
    requests: int
    skipped_invalid: int = 0
    # Session corpora: how many sessions the requests (turns) make up; absent otherwise.
    sessions: int | None = None


class ReplayResults(_Model):
    schema_version: int = SCHEMA_VERSION
    started_at: str
    url: str
    model: str
    api: Literal["completions", "chat"]
    corpus: CorpusInfo
    settings: dict[str, Any]
    slo: dict[str, float]
    # What was measured: the server's version, the model, the hardware, ... (None in version 1).
    identity: Identity | None = None
    steps: list[StepResult] = Field(default_factory=list)
    find_max: bool = False
    # What the concurrencies count: "sessions" (users) for a session corpus; absent: requests.
    concurrency_unit: Literal["requests", "sessions"] | None = None
    max_passing_concurrency: int | None = None
    min_failing_concurrency: int | None = None
    binding_constraint: str | None = None
    # Rules undecided at the lowest failing step, apart from the binding constraint (they did not
    # bind): "tpot_p90_ms: undecided after 13 requests".
    binding_undecided: list[str] = Field(default_factory=list)
    # The search re-measured max_passing_concurrency on fresh prompts and it passed again.
    confirmed: bool | None = None
    # [highest conclusive pass, lowest conclusive fail]; either may be null.
    knee_interval: list[int | None] | None = None
    # Concurrencies whose every step ran out of time before it could resolve (never failures).
    unresolved_concurrency: list[int] = Field(default_factory=list)
    # Concurrencies whose every step was disturbed (replay.environment), measured again up to
    # [replay] disturbed_retries times; and whether interference was allowed (never flagged).
    disturbed_concurrency: list[int] = Field(default_factory=list)
    interference_allowed: bool = False
    # Where the search began and why (the saturation probe's count, max_concurrency, start_concurrency).
    search_start: int | None = None
    search_start_reason: str | None = None
    # The search stopped on [replay] point_budget_s before it was done.
    budget_exhausted: bool = False
    interrupted: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_version_1(cls, data: Any) -> Any:
        # Version 1 differs only by lacking `identity`, which stays None (unknown).
        if isinstance(data, dict) and data.get("schema_version") == 1:
            return {**data, "schema_version": SCHEMA_VERSION}
        return data


M = TypeVar("M", bound=BaseModel)


def updated(model: M, **fields: Any) -> M:
    """A copy of `model` with `fields` replaced, validated like a new one (model_copy(update=...)
    would take a wrong type without a word)."""
    return type(model).model_validate({**model.model_dump(), **fields})


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of either."""
    with atomic_text(path) as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
