"""Replay settings: one validated model shared by `planner replay` and the sweep's [replay] table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from replay.client.streaming import StreamingClient
from replay.load.order import RequestOrder
from replay.slo import rules as slo_mod
from replay.step.environment import Interference
from replay.step.window import Window


class ReplaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The endpoint: /v1/completions, or /v1/chat/completions (corpus lines in messages form always go there).
    api: Literal["completions", "chat"] = "completions"
    # Output length for requests whose corpus line has no max_tokens (None: the server's default).
    max_tokens: int | None = Field(default=None, ge=1)
    # Ask vLLM to keep generating to max_tokens, so the corpus's output lengths are really produced.
    ignore_eos: bool = True
    # The longest one request may take before it fails as a timeout.
    request_timeout_s: float = Field(default=600.0, gt=0)
    # The loads to run, in order (closed-loop concurrency, open-loop Poisson rates, or the trace).

    # Closed-loop loads: this many requests (or sessions) in flight at all times.
    concurrency: list[int] = Field(default_factory=list)
    # Open-loop loads: Poisson arrivals at these rates, requests (or sessions) a second, seeded with seed.
    rate: list[float] = Field(default_factory=list)
    # Replay the corpus's timestamp_s arrivals.
    trace: bool = False
    # Speed-up of the trace's arrivals (2: twice as fast).
    trace_speed: float = Field(default=1.0, gt=0)
    # Seed of the open-loop arrivals and think times; saved with the results.
    seed: int = 0
    # The order requests are sent in: "balanced" keeps what the KV cache holds on average (prompt
    # plus half the output, over the output's decode steps) the corpus's in every run of consecutive
    # requests, wherever in the corpus a step starts (replay.load.order); "mixed" (the default
    # before a balanced order) ranks them by estimated tokens and interleaves the ranks; "file"
    # sends them as the file lists them. Not used for a trace (its timestamps order it) or a
    # session corpus.
    request_order: RequestOrder = "balanced"
    # A closed loop's ramp-up, in seconds: its workers start evenly over it instead of all at once
    # (replay.load.drivers), and the window opens no sooner. Unset: one request duration, as the
    # run's earlier step nearest in load measured it (its load over its throughput; none on a run's
    # first step). 0: all at once, as before the key.
    ramp_s: float | None = Field(default=None, ge=0)
    # Session corpora: the user's reading time before a turn whose line has no think_time_s,
    # its mean in seconds and its distribution (replay.load.conversation.ThinkTime).
    think_time_s: float = Field(default=0.0, ge=0)
    # Think times drawn around think_time_s: exponential, or fixed (always the mean).
    think_time_distribution: Literal["fixed", "exponential"] = "exponential"
    # Measurement windows (see replay.step.window).

    # Unmeasured requests before each window opens (None: the step's concurrency).
    warmup_requests: int | None = Field(default=None, ge=0)
    # Unmeasured warm-up time before the window opens, besides warmup_requests.
    warmup_s: float = Field(default=0.0, ge=0)
    # The fewest measured requests a window closes on. None: what the SLOs' percentiles need for a
    # finite bound (368 for a p99), at least 100.
    min_requests: int | None = Field(default=None, ge=1)
    # An inconclusive window measures on to this many requests (None: 4 x min_requests).
    max_requests: int | None = Field(default=None, ge=1)
    # The least time a window stays open, whatever its request count.
    min_window_s: float = Field(default=0.0, ge=0)
    # The window's time limit. None: sized from the request duration the warm-up measured (twice
    # the expected wall time of max_requests; replay.step.window).
    max_window_s: float | None = Field(default=None, gt=0)
    # The longest a warm-up may take before the server counts as stalled (with max_window_s unset).
    warmup_timeout_s: float = Field(default=600.0, gt=0)
    # How often the server's /metrics is scraped during a step, in seconds.
    metrics_interval_s: float = Field(default=1.0, gt=0)
    # A step is flagged client_or_network_latency when the client's mean TTFT exceeds vLLM's by
    # more than the larger of these two (replay.server.crosscheck).
    client_ttft_excess_ms: float = Field(default=10.0, ge=0)
    # The fraction of vLLM's mean TTFT that the client's may exceed it by (see client_ttft_excess_ms).
    client_ttft_excess_fraction: float = Field(default=0.10, ge=0)
    # The search for the highest passing concurrency.

    # Search for the highest concurrency that meets the SLOs (replay --find-max); a sweep always searches.
    find_max: bool = False
    # The first probe. None: the capacity bound (a sweep), max_concurrency, or the saturation
    # probe's count (replay.search.saturation).
    start_concurrency: int | None = Field(default=None, ge=1)
    # The highest concurrency the search may probe (a sweep: also caps the capacity bound).
    max_concurrency: int | None = Field(default=None, ge=1)
    # The search ends when its bracket is within one request or this fraction.
    precision: float = Field(default=0.05, gt=0, lt=1)
    # Requests the saturation probe sends at once.
    saturation_requests: int = Field(default=256, ge=1)
    # The most one search (a sweep's point, or replay --find-max) may take, in seconds; what it
    # could not resolve by then is reported as such. None: no limit.
    point_budget_s: float | None = Field(default=None, gt=0)
    # Measure the highest passing concurrency again on fresh prompts before reporting it.
    confirm_knee: bool = True
    # Record what else ran during each step but never call a step disturbed
    # (replay.step.environment; the results say so).
    allow_interference: bool = False
    # A step is disturbed when other processes used more than this share of the server's CPUs
    # (its CPUs x the window).
    interference_cpu_share: float = Field(default=0.10, ge=0, le=1)
    # A step is disturbed when another compute process ran on the point's GPUs.
    interference_foreign_gpu: bool = True
    # A step is disturbed when a GPU was throttled (thermal or hardware slowdown) for more than
    # this share of the window.
    interference_throttle_share: float = Field(default=0.10, ge=0, le=1)
    # Count the GPU's software power cap as throttling (a GPU at its power limit under full load).
    interference_power_cap: bool = False
    # How many times a disturbed concurrency is measured again before the search stops there.
    disturbed_retries: int = Field(default=2, ge=0)
    # The knee read from every step is the highest load whose fitted pass probability is at least
    # this (replay.search.pass_fit).
    knee_pass_probability: float = Field(default=0.9, gt=0, lt=1)
    # Merged into every request body (temperature, top_p, ...).
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _positive_loads(self) -> ReplaySettings:
        if any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency values must be >= 1, got {self.concurrency}")
        if any(r <= 0 for r in self.rate):
            raise ValueError(f"rate values must be > 0 requests/s, got {self.rate}")
        return self

    @model_validator(mode="after")
    def _window_bounds(self) -> ReplaySettings:
        if self.min_requests is not None and self.max_requests is not None and self.max_requests < self.min_requests:
            raise ValueError(f"max_requests {self.max_requests} is below min_requests {self.min_requests}")
        return self

    def interference(self) -> Interference:
        return Interference(
            cpu_share=self.interference_cpu_share,
            foreign_gpu_process=self.interference_foreign_gpu,
            throttle_share=self.interference_throttle_share,
            power_cap=self.interference_power_cap,
            allow=self.allow_interference,
        )

    def window(self, slo: Mapping[str, float] | None = None) -> Window:
        min_requests = self.min_requests or slo_mod.min_requests_for(slo or {})
        return Window(
            warmup_requests=self.warmup_requests,
            warmup_s=self.warmup_s,
            min_requests=min_requests,
            max_requests=max(self.max_requests or 4 * min_requests, min_requests),
            min_window_s=self.min_window_s,
            max_window_s=self.max_window_s,
            warmup_timeout_s=self.warmup_timeout_s,
        )

    def client(self, url: str, *, model: str | None, api_key: str | None, max_connections: int) -> StreamingClient:
        """The one client these settings ask for (`planner replay` and a sweep's point build it here)."""
        return StreamingClient(
            url,
            model=model,
            api=self.api,
            api_key=api_key,
            max_connections=max_connections,
            request_timeout_s=self.request_timeout_s,
            ignore_eos=self.ignore_eos,
            default_max_tokens=self.max_tokens,
            extra_body=self.extra_body,
        )
