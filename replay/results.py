"""The results schema (replay.json) and its atomic writer.

Every figure carries its unit in its name. Results are pure data: reports and plots are rebuilt
from them without a server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, model_validator

from replay.atomic import atomic_text
from replay.identity import Identity
from replay.model import ResultModel

# 2: `identity`, what the run measured (replay.identity); version 1 files load without it.
SCHEMA_VERSION = 2

LoadMode = Literal["concurrency", "rate", "trace"]
# unresolved: the window ran out of time before its bounds were finite (see replay.step.window).
Verdict = Literal["pass", "fail", "inconclusive", "unresolved"]


class LatencySummary(ResultModel):
    # The mean over the window's measured requests.
    mean: float | None = None
    # The median.
    p50: float | None = None
    # The 90th percentile.
    p90: float | None = None
    # The 95th percentile.
    p95: float | None = None
    # The 99th percentile.
    p99: float | None = None
    # The largest value measured.
    max: float | None = None
    # 95% intervals in arrival order (see replay.stats.intervals): {"mean": [lo, hi], "p50": [lo, hi], ...};
    # a side is null where the sample is too small for a finite bound; absent in older files.
    ci95: dict[str, list[float | None]] | None = None


class LoadSpec(ResultModel):
    # concurrency (closed loop), rate (open loop, Poisson arrivals) or trace (the corpus's
    # timestamp_s).
    mode: LoadMode
    # concurrency: requests in flight; rate: requests per second; trace: speed factor
    value: float
    # The seed of an open-loop load's arrivals.
    seed: int | None = None


class ServerLatency(ResultModel):
    """One of vLLM's latency histograms over the window (its delta), in milliseconds.

    Quantiles use PromQL's histogram_quantile interpolation; `<q>_bucket_ms` is the bucket
    [lower, upper] each fell in (upper null: above the highest finite bucket), the figure's
    resolution. `count` is the number of observations in the window.
    """

    # Observations in the window.
    count: float = 0
    # The exact mean (_sum / _count).
    mean: float | None = None
    # The median, interpolated as PromQL's histogram_quantile does.
    p50: float | None = None
    # The 90th percentile, interpolated likewise.
    p90: float | None = None
    # The 95th percentile, interpolated likewise.
    p95: float | None = None
    # The 99th percentile, interpolated likewise.
    p99: float | None = None
    # The bucket [lower, upper] the median fell in (upper null: above the highest finite bucket).
    p50_bucket_ms: tuple[float, float | None] | None = None
    # The bucket the 90th percentile fell in.
    p90_bucket_ms: tuple[float, float | None] | None = None
    # The bucket the 95th percentile fell in.
    p95_bucket_ms: tuple[float, float | None] | None = None
    # The bucket the 99th percentile fell in.
    p99_bucket_ms: tuple[float, float | None] | None = None


class ServerSummary(ResultModel):
    # The server exported vLLM's metrics at /metrics; false: the SLOs that need them are in
    # slo_unverified.
    metrics_available: bool = False
    # Why metrics are missing, when they are ("no vllm:* metrics at /metrics", "HTTP 404", ...).
    metrics_note: str | None = None
    # /metrics scrapes during the step (about one a second).
    samples: int = 0
    # False when /metrics answered during the step but no sample fell inside the window or near
    # its edges (a scrape stalled on a busy server): the gauges' peaks are then unknown (null).
    window_sampled: bool = True
    # True when the window had samples and every one read no request running while requests
    # finished in it: the engine ran them between scrapes, so the running, KV and waiting peaks
    # are unknown (null, metrics_note says so), never read as 0.
    samples_saw_no_work: bool = False
    # The highest vllm:kv_cache_usage_perc seen during the window (0-1); null when no sample was
    # taken in the window or none caught a request running (samples_saw_no_work).
    kv_cache_usage_peak: float | None = None
    # The change in vllm:num_preemptions_total across the window; null when the counter was not
    # read at both of the window's edges (a scrape stalled on a busy server), never read as 0.
    preemptions: float | None = None
    # When preemptions is null for that reason: the change between the reads that were made, a
    # lower bound of the window's count (metrics_note says which part of the window they span).
    preemptions_at_least: float | None = None
    # The most requests vLLM ran at once (vllm:num_requests_running).
    running_peak: float | None = None
    # The most requests waiting in vLLM's queue (vllm:num_requests_waiting).
    waiting_peak: float | None = None
    # vLLM's own latency histograms over the window (null: not exported, or counters reset).

    # Time to first token (vllm:time_to_first_token_seconds).
    ttft_ms: ServerLatency | None = None
    # Inter-token latency (vllm:inter_token_latency_seconds, or the older
    # vllm:time_per_output_token_seconds).
    itl_ms: ServerLatency | None = None
    # Time per output token per request (vllm:request_time_per_output_token_seconds).
    tpot_ms: ServerLatency | None = None
    # End-to-end latency (vllm:e2e_request_latency_seconds).
    e2e_ms: ServerLatency | None = None
    # Time spent waiting in the queue (vllm:request_queue_time_seconds).
    queue_ms: ServerLatency | None = None
    # Prefill time (vllm:request_prefill_time_seconds).
    prefill_ms: ServerLatency | None = None
    # Decode time (vllm:request_decode_time_seconds).
    decode_ms: ServerLatency | None = None
    # Counter deltas over the window.

    # Requests vLLM finished over the window.
    requests_finished: float | None = None
    # Prompt tokens the server processed.
    prompt_tokens: float | None = None
    # Tokens the server generated.
    generation_tokens: float | None = None
    # vLLM's prefix cache over the window: prompt tokens looked up and found (vllm:prefix_cache_*),
    # and hits / queries; external_: a KV connector's cross-instance cache, when it has one.
    prefix_cache_queries: float | None = None
    # Prompt tokens found in vLLM's prefix cache (vllm:prefix_cache_hits).
    prefix_cache_hits: float | None = None
    # prefix_cache_hits / prefix_cache_queries; null when nothing was queried or the server does not
    # export them.
    prefix_cache_hit_rate: float | None = None
    # The same for a KV connector's cross-instance cache; null without one.
    external_prefix_cache_queries: float | None = None
    # Prompt tokens found in a KV connector's cache; null without one.
    external_prefix_cache_hits: float | None = None
    # external_prefix_cache_hits / external_prefix_cache_queries.
    external_prefix_cache_hit_rate: float | None = None
    # A counter went back between the window's snapshots (a restarted server).
    counter_reset: bool = False
    # Why some or all histogram figures are missing.
    histograms_note: str | None = None


class ClientSummary(ResultModel):
    # Open-loop loads: how late requests left against their schedule.
    send_lag_p99_ms: float | None = None
    # How late the event loop woke against a 10 ms ticker, for every load mode.
    loop_lag_p99_ms: float | None = None
    # The client, not the server, may have been the limit: send lag or loop lag p99 above 50 ms.
    client_limited: bool = False
    # Why client_limited was set.
    note: str | None = None
    # Requests the client saw finish between the server's two /metrics snapshots (at the window's
    # open and close; the window itself without them), to compare with the server's count.
    requests_finished: int | None = None
    # Client minus server (vLLM's histograms) over the same window.

    # The client's mean TTFT minus vLLM's.
    ttft_mean_minus_server_ms: float | None = None
    # The client's mean TPOT minus vLLM's.
    tpot_mean_minus_server_ms: float | None = None
    # requests_finished minus the server's count over the same snapshots.
    requests_minus_server: float | None = None
    # The client's TTFT exceeds the server's by more than the threshold: the client side
    # (its machine, its event loop, the network), not the engine, added that latency.
    client_or_network_latency: bool = False
    # Why client_or_network_latency was set, with the figures.
    latency_note: str | None = None
    # Chunks that arrived together (their gap below the clock's resolution): left out of ITL.
    itl_bursts: int = 0
    # The chunk gaps of those bursts (counted apart, as planner_itl_burst_gaps_total).
    itl_burst_gaps: int = 0
    # Connects tried again by the measured requests before their connection opened (each waited
    # for it, inside its latency); a connect that failed every try is an error of kind "connect".
    connect_retries: int = 0


class TurnLatency(ResultModel):
    """One turn number's figures over a step's measured session turns."""

    # Measured turns with this turn number.
    count: int
    # Their time to first token.
    ttft_ms: LatencySummary
    # Their end-to-end latency.
    e2e_ms: LatencySummary
    # Mean prompt tokens sent at this turn (the server's usage), and of them the history resent
    # (the previous turn's prompt plus its output); null where the server sent no usage.
    prompt_tokens_mean: float | None = None
    # Mean history tokens resent at this turn.
    resent_tokens_mean: float | None = None


class SessionSummary(ResultModel):
    """A session corpus's step: users (sessions in flight) against requests in flight, both
    time-weighted over the window, and what completed inside it."""

    # Sessions (users) in flight, time-weighted over the window.
    sessions_in_flight_mean: float | None = None
    # The most sessions in flight at once.
    sessions_in_flight_peak: int | None = None
    # Requests in flight, time-weighted over the window (users who read hold none).
    requests_in_flight_mean: float | None = None
    # The most requests in flight at once.
    requests_in_flight_peak: int | None = None
    # Sessions started inside the window.
    sessions_started: int = 0
    # Sessions that finished their last turn inside the window.
    sessions_completed: int = 0
    # Turns (requests) completed inside the window.
    turns_completed: int = 0
    # Keyed by turn number ("1", "2", ...): the cost of a growing context.
    by_turn: dict[str, TurnLatency] = Field(default_factory=dict)
    # Prompt tokens that were history resent, over the window's completed turns (null: no usage).
    resent_tokens: int | None = None


class ProcessUse(ResultModel):
    """One process other than the server's and the planner's, and the CPU time it used in the
    window."""

    # Its process id.
    pid: int
    # Its name (/proc/<pid>/stat's comm).
    name: str
    # CPU seconds it used during the window.
    cpu_s: float
    # The CPU sets it ran on: "server", "planner" (both when they are the same CPUs; none when it
    # ran elsewhere).
    on: list[str] = Field(default_factory=list)


class CpuEnvironment(ResultModel):
    """The CPUs during a step's window, from /proc."""

    # The 1-minute load average at the window's close.
    load_avg_1m: float | None = None
    # The 5-minute load average at the window's close.
    load_avg_5m: float | None = None
    # The CPUs the server may run on ([cpus] client pins them; else its affinity).
    server_cpus: list[int] = Field(default_factory=list)
    # The CPUs the planner may run on (every CPU when nothing is pinned).
    planner_cpus: list[int] = Field(default_factory=list)
    # CPU seconds the server's process tree (its descendants and process group) used.
    server_cpu_s: float | None = None
    # CPU seconds the planner used (its process and its helpers, less the server it launched).
    planner_cpu_s: float | None = None
    # CPU seconds other processes used on the server's CPUs.
    other_cpu_s_server_cpus: float | None = None
    # That as a share of the server's CPUs' time (CPUs x window): the disturbed rule's figure.
    other_share_server_cpus: float | None = None
    # CPU seconds other processes used on the planner's CPUs.
    other_cpu_s_planner_cpus: float | None = None
    # That as a share of the planner's CPUs' time (CPUs x window).
    other_share_planner_cpus: float | None = None
    # Steal time as a share of all CPU time over the window (a virtual machine's host took it).
    steal_share: float | None = None
    # The other processes that used the most CPU, busiest first (at most three).
    busiest: list[ProcessUse] = Field(default_factory=list)


class GpuProcess(ResultModel):
    """A compute process on one of the point's GPUs that is not the server's."""

    # The GPU's index (nvidia-smi's).
    gpu: str
    # Its process id.
    pid: int
    # Its name, as nvidia-smi gives it.
    name: str
    # GPU memory it held, in MiB.
    used_mib: float | None = None


class GpuState(ResultModel):
    """One GPU over the window, from the samples taken inside it."""

    # Samples taken inside the window (about one a second).
    samples: int = 0
    # The mean SM clock over the samples.
    sm_clock_mhz_mean: float | None = None
    # The lowest SM clock sampled.
    sm_clock_mhz_min: float | None = None
    # The SM clock's maximum (clocks.max.sm).
    sm_clock_max_mhz: float | None = None
    # Share of the samples with a thermal or hardware slowdown (or the power brake) active.
    throttled_share: float | None = None
    # Share of the samples with the software power cap active (a GPU at its power limit under full
    # load: how it serves, so not interference unless [replay] interference_power_cap).
    power_capped_share: float | None = None
    # Every throttle reason seen in the window.
    throttle_reasons: list[str] = Field(default_factory=list)
    # The highest temperature sampled, in degrees Celsius.
    temperature_c_max: float | None = None
    # The highest power draw sampled, in watts.
    power_draw_w_max: float | None = None


class GpuEnvironment(ResultModel):
    """The point's GPUs during a step's window, from nvidia-smi."""

    # Each GPU's record, by index.
    gpus: dict[str, GpuState] = Field(default_factory=dict)
    # Compute processes on these GPUs that are not the server's.
    foreign_processes: list[GpuProcess] = Field(default_factory=list)


class StepEnvironment(ResultModel):
    """What else the machine did during a step's window (see replay.step.environment)."""

    # The CPUs (null: /proc could not be read).
    cpu: CpuEnvironment | None = None
    # The point's GPUs (null: not watched, as in `planner replay` or CPU mode).
    gpu: GpuEnvironment | None = None
    # What could not be read on this machine ("no /proc: CPU use not recorded", ...).
    unreadable: list[str] = Field(default_factory=list)


class SloPooled(ResultModel):
    """A percentile rule the step alone left undecided, decided on the point's steps around its
    load (replay.stats.across_steps.pooled_check): passed on the steps from its load up, or failed
    on those from below up to it."""

    # "pass" or "fail".
    verdict: Literal["pass", "fail"]
    # The loads of the steps pooled, this step's included (on several server starts, its own start's only).
    loads: list[float]
    # The pooled figure (a precision-weighted geometric mean), in ms.
    figure: float
    # Its 95% interval, in ms: below the bound for a pass, above it for a fail.
    ci95: list[float]


class SloExceedance(ResultModel):
    """The order-statistic test that passed a percentile rule (replay.slo.exceedance): `exceeded`
    of the `n` measured requests were above the bound, and the test allows at most `allowed` (it
    counts on `effective_n` independent requests, n shrunk by their correlation)."""

    # Measured requests above the bound.
    exceeded: int
    # Measured requests the test counted.
    n: int
    # The most requests above the bound the test allows for a pass.
    allowed: int
    # The independent requests the test counted on (n shrunk by their correlation).
    effective_n: int | None = None


class StepResult(ResultModel):
    # The load this step held.
    load: LoadSpec
    # When the step started (UTC, ISO 8601).
    started_at: str
    # Which start of the point's server measured it (1, 2, ...) when the point was searched on
    # several ([sweep] server_starts); null when it was searched on one.
    server_start: int | None = None
    # Unmeasured requests sent before the window opened.
    warmup_requests: int
    # The measurement window's length in seconds.
    window_s: float
    # Measured requests that succeeded.
    requests_ok: int
    # Measured requests that failed (see errors).
    requests_failed: int
    # Still running when the window closed: finished but not counted.
    requests_drained: int = 0
    # Failed requests by kind: connect, timeout, http_<status>, broken_stream, server_error.
    errors: dict[str, int] = Field(default_factory=dict)
    # One message per error kind, as the server or the connection gave it.
    error_samples: dict[str, str] = Field(default_factory=dict)
    # Time to first token of the measured requests.
    ttft_ms: LatencySummary
    # Gaps between consecutive content chunks (inter-token latency), bursts left out.
    itl_ms: LatencySummary
    # Time per output token after the first, per request.
    tpot_ms: LatencySummary
    # End-to-end latency of the measured requests.
    e2e_ms: LatencySummary
    # Requests that finished inside the window, per second.
    requests_per_s: float
    # Prompt tokens per second (null without usage).
    input_tokens_per_s: float | None
    # Output tokens per second.
    output_tokens_per_s: float
    # "usage" when every counted request carried a usage chunk; "chunks" when the server sent
    # none and tokens were counted as content chunks; "mixed" otherwise.
    tokens_source: Literal["usage", "chunks", "mixed", "none"]
    # What vLLM's /metrics said over the window.
    server: ServerSummary
    # The client's self-checks and the client-against-server comparison.
    client: ClientSummary
    # True only when slo_verdict is pass.
    slo_pass: bool
    # Every SLO that kept the step from passing (failed or inconclusive).
    slo_violations: list[str] = Field(default_factory=list)
    # SLOs that could not be checked (no vLLM metrics for max_preemptions, ...).
    slo_unverified: list[str] = Field(default_factory=list)
    # The view each SLO was judged on: "client" (the replay's records) or "server" (vLLM's metrics).
    slo_views: dict[str, str] = Field(default_factory=dict)
    # Three-valued SLO verdicts (pass: the whole 95% interval meets the bound; fail: it breaks it;
    # inconclusive: otherwise). slo_pass is true only for "pass"; absent in older files.
    slo_verdict: Verdict | None = None
    # The verdict of each SLO: pass, fail, inconclusive or unresolved.
    slo_verdicts: dict[str, Verdict] = Field(default_factory=dict)
    # Each client-side percentile rule that passed: the exceedance test that passed it (shown
    # beside an interval that is open above). Absent in older files.
    slo_exceedance: dict[str, SloExceedance] = Field(default_factory=dict)
    # Percentile rules judged across steps (replay.stats.across_steps): per rule, the 95% interval
    # the verdict rests on (the step's own ci95 with its tau floored, widened by the between-step
    # margin). Absent in older files.
    slo_ci95: dict[str, list[float | None]] = Field(default_factory=dict)
    # Per percentile rule, the step's own tau (Geyer's or batch means', the larger), which the
    # point's later steps pool as a floor. Absent in older files.
    slo_tau: dict[str, float] = Field(default_factory=dict)
    # Per percentile rule, the step's own tau on the series the verdict counts (whether each
    # request met the bound; 1 where all did or none did), which the point's later steps pool as
    # the floor of their count test. Absent in older files (slo_tau then stands in).
    slo_tau_bound: dict[str, float] = Field(default_factory=dict)
    # Per percentile rule, the between-step sd of the figure's natural log behind the margin (only
    # rules with a margin). Absent in older files.
    slo_margin_log_sd: dict[str, float] = Field(default_factory=dict)
    # Per percentile rule this step alone left undecided and its neighbours decided: what they
    # showed. Absent in older files and where no rule was decided so.
    slo_pooled: dict[str, SloPooled] = Field(default_factory=dict)
    # Rules over a maximum judged the same at any length (replay.slo.max_rules): preemptions while
    # the window's first 100 measured requests ran, which max_preemptions = 0 judges. Null when
    # not judged.
    preemptions_in_exposure: float | None = None
    # Preemptions per measured request over the window, which max_preemptions = N > 0 judges
    # against N per 100 requests. Null when not judged.
    preemptions_per_request: float | None = None
    # Its exact Poisson (Garwood) 95% interval.
    preemptions_per_request_ci95: list[float] | None = None
    # The share of the window's KV-cache usage samples above kv_cache_usage_max, which that rule
    # judges (at most 5%). Null when not judged.
    kv_cache_above_share: float | None = None
    # How many KV-cache usage samples inside the window that share was read from; the rule is
    # judged on at least 20 (fewer: inconclusive unless the share would stay over 5% at 20).
    kv_cache_samples: int | None = None
    # 95% interval of requests_per_s (batch means over ten slices of the window).
    requests_per_s_ci95: list[float | None] | None = None
    # 95% interval of output_tokens_per_s.
    output_tokens_per_s_ci95: list[float | None] | None = None
    # Measured requests that met every per-request latency bound (see replay.slo.rules.per_request_bounds).
    slo_attainment: float | None = None
    # Its 95% interval (Wilson, on the effective sample size).
    slo_attainment_ci95: list[float | None] | None = None
    # requests_per_s x slo_attainment.
    goodput_requests_per_s: float | None = None
    # Early measured requests dropped as not yet in steady state (replay.stats.steady).
    steady_state_dropped: int = 0
    # What closed the window: requests (its minimum or maximum), verdict (conclusive early),
    # time (its limit), budget (the point's), stall (the warm-up never finished), trace_end, abort.
    window_closed_by: str | None = None
    # The window's time limit (max_window_s, or sized from the warm-up), and the warm-up's mean
    # request duration it was sized from.
    window_limit_s: float | None = None
    # The warm-up's mean request duration, which window_limit_s was sized from.
    request_duration_s: float | None = None
    # A closed loop's ramp-up: its workers started evenly over this many seconds (0: all at once,
    # as every step did before ramps, and every open-loop step).
    ramp_s: float = 0.0
    # Filled in by planner sweep: peak used memory per GPU during the step.
    gpu_memory_peak_mib: dict[str, float] | None = None
    # What else the machine did during the window (replay.step.environment); absent in older files.
    environment: StepEnvironment | None = None
    # What disturbed the step, one phrase per cause (empty: clean); a disturbed step carries no
    # information, and the search measures it again.
    disturbed: list[str] = Field(default_factory=list)
    # Session corpora only: the load's value counts sessions (users); this says how they mapped
    # to requests in flight, and the per-turn figures. Absent for plain corpora and older files.
    sessions: SessionSummary | None = None


class PassPoint(ResultModel):
    """One load of a point's pass-probability fit (replay.search.pass_fit)."""

    # The load (concurrency) the steps ran at.
    concurrency: int
    # Steps at this load that passed.
    passes: int
    # Informative steps measured at this load (unresolved ones left out).
    steps: int
    # The fitted probability that a step at this load passes (isotonic, non-increasing in load).
    probability: float
    # Its Wilson 95% interval, on the evidence the fit pooled.
    ci95: list[float]


class CorpusInfo(ResultModel):
    # The corpus file.
    path: str
    # Its SHA-256.
    sha256: str
    # Requests (session turns) read from it.
    requests: int
    # Bad lines skipped (--skip-invalid).
    skipped_invalid: int = 0
    # Session corpora: how many sessions the requests (turns) make up; absent otherwise.
    sessions: int | None = None


class ReplayResults(ResultModel):
    # The file's format version.
    schema_version: int = SCHEMA_VERSION
    # When the run started (UTC, ISO 8601).
    started_at: str
    # The server's base URL.
    url: str
    # The model the requests named.
    model: str
    # The endpoint: completions or chat.
    api: Literal["completions", "chat"]
    # The prompt corpus.
    corpus: CorpusInfo
    # The replay settings as run ([replay] keys), the seed included.
    settings: dict[str, Any]
    # The SLO bounds, by key.
    slo: dict[str, float]
    # What was measured: the server's version, the model, the hardware, ... (None in version 1).
    identity: Identity | None = None
    # Every step, in the order run.
    steps: list[StepResult] = Field(default_factory=list)
    # The run searched for the highest passing concurrency.
    find_max: bool = False
    # What the concurrencies count: "sessions" (users) for a session corpus; absent: requests.
    concurrency_unit: Literal["requests", "sessions"] | None = None
    # The highest concurrency whose steps passed (confirmed when confirmed is true).
    max_passing_concurrency: int | None = None
    # The lowest concurrency that failed or was inconclusive.
    min_failing_concurrency: int | None = None
    # The SLOs the lowest failing step broke.
    binding_constraint: str | None = None
    # Rules undecided at the lowest failing step, apart from the binding constraint (they did not
    # bind): "tpot_p90_ms: undecided after 13 requests".
    binding_undecided: list[str] = Field(default_factory=list)
    # The search re-measured max_passing_concurrency on fresh prompts and it passed again.
    confirmed: bool | None = None
    # [highest conclusive pass, lowest conclusive fail]; either may be null.
    knee_interval: list[int | None] | None = None
    # The knee read from every step (replay.search.pass_fit): the highest measured load whose
    # fitted pass probability is at least knee_fit_level. Absent in older files.
    knee_fit: int | None = None
    # The pass-probability level knee_fit was read at ([replay] knee_pass_probability).
    knee_fit_level: float | None = None
    # [highest load at and below which every step passed, highest load with a pass]: where the
    # steps disagree or fail.
    knee_band: list[int | None] | None = None
    # Loads that both passed and did not pass (shown, never hidden).
    contested_concurrency: list[int] = Field(default_factory=list)
    # The fit per load: passes, steps, fitted pass probability and its interval.
    pass_probability: list[PassPoint] = Field(default_factory=list)
    # Concurrencies whose every step ran out of time before it could resolve (never failures).
    unresolved_concurrency: list[int] = Field(default_factory=list)
    # Concurrencies whose every step was disturbed (replay.step.environment), measured again up to
    # [replay] disturbed_retries times.
    disturbed_concurrency: list[int] = Field(default_factory=list)
    # --allow-interference: the environment was recorded, no step was called disturbed.
    interference_allowed: bool = False
    # Where the search began and why (the saturation probe's count, max_concurrency, start_concurrency).
    search_start: int | None = None
    # Why the search began there.
    search_start_reason: str | None = None
    # The search stopped on [replay] point_budget_s before it was done.
    budget_exhausted: bool = False
    # The run was stopped (Ctrl-C or SIGTERM); the finished steps are kept.
    interrupted: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_older_files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        # Version 1 differs only by lacking `identity`, which stays None (unknown).
        if data.get("schema_version") == 1:
            data = {**data, "schema_version": SCHEMA_VERSION}
        return {**data, "settings": with_older_defaults(data.get("settings"))}


# Replay settings keys added since results files were first written, with the value that says what
# a file from before the key did: the corpus sent in its file's order; closed loops started at once.
KEYS_OF_OLDER_FILES = {"request_order": "file", "ramp_s": 0.0}


def with_older_defaults(settings: Any) -> Any:
    """Saved replay settings with every key added since (KEYS_OF_OLDER_FILES): a file written
    before a key says, once read, how it measured."""
    if isinstance(settings, dict):
        return {**KEYS_OF_OLDER_FILES, **settings}
    return settings


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
