"""The planner's own Prometheus metrics, served while a replay or a sweep runs (--metrics-port).

Each PlannerMetrics has its own CollectorRegistry, so two in one process (tests, a sweep inside
a notebook) never collide and nothing leaks into prometheus_client's global registry. It is a
replay observer (replay/step/observer.py) and the sweep also tells it which point is being measured;
every series carries that point's id in the `point` label (a plain replay's is "replay").

Histograms count only measured requests, so their quantiles agree with replay.json's step
figures (chunk gaps below the clock's resolution, bursts, are counted apart and not observed as
ITL, as in the step figures); planner_requests_total counts every finished request, warm-up
included, since that is the traffic the server saw. The TTFT, ITL, TPOT and e2e histograms sit
beside vLLM's own on the dashboard.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from planner.errors import ConfigError
from replay.records import RequestRecord
from replay.results import LoadSpec, StepResult
from replay.server.crosscheck import CLOCK_RESOLUTION_S

DEFAULT_POINT = "replay"

# A request's latency runs from milliseconds (TTFT on an idle server) to minutes (a long
# generation behind a queue); the default buckets stop at 10 s.
REQUEST_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)
# The gap between two tokens sits between about 1 ms and a second even under heavy load.
TOKEN_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
)

POINT_INFO_KEYS = ("max_model_len", "gpu_memory_utilization", "tensor_parallel_size")


class PlannerMetrics:
    """Live metrics of a replay or sweep. Call `start(port=...)` to serve them over HTTP."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "planner_requests", "Finished requests by outcome (ok or the error kind)", ["point", "status"], registry=r
        )
        self.inflight = Gauge("planner_inflight_requests", "Requests sent and not yet finished", ["point"], registry=r)
        self.target_concurrency = Gauge(
            "planner_target_concurrency", "Concurrency the current step holds (closed-loop steps)", ["point"], registry=r
        )
        self.target_rate = Gauge(
            "planner_target_rate_rps", "Arrival rate of the current step, requests/s (open-loop steps)", ["point"], registry=r
        )
        self.ttft = Histogram(
            "planner_ttft_seconds", "Time to first token of measured requests", ["point"], buckets=REQUEST_BUCKETS_S, registry=r
        )
        self.itl = Histogram(
            "planner_itl_seconds", "Gaps between consecutive content chunks of measured requests", ["point"],
            buckets=TOKEN_BUCKETS_S, registry=r,
        )
        self.tpot = Histogram(
            "planner_tpot_seconds", "Time per output token after the first, per measured request", ["point"],
            buckets=TOKEN_BUCKETS_S, registry=r,
        )
        self.itl_burst_gaps = Counter(
            "planner_itl_burst_gaps", "Chunk gaps below the clock's resolution (chunks read together), not observed as ITL",
            ["point"], registry=r,
        )
        self.e2e = Histogram(
            "planner_e2e_seconds", "End-to-end latency of measured requests", ["point"], buckets=REQUEST_BUCKETS_S, registry=r
        )
        self.step_slo_pass = Gauge(
            "planner_step_slo_pass", "1 when the last finished step met every SLO, 0 when it did not", ["point"], registry=r
        )
        self.steps = Counter("planner_steps", "Finished steps by SLO verdict", ["point", "slo_pass"], registry=r)
        self.step_requests_per_s = Gauge(
            "planner_step_requests_per_s", "Request rate measured in the last finished step", ["point"], registry=r
        )
        self.step_output_tokens_per_s = Gauge(
            "planner_step_output_tokens_per_s", "Output tokens/s measured in the last finished step", ["point"], registry=r
        )
        self.search_eta = Gauge(
            "planner_search_eta_seconds", "Estimated seconds until the point's search ends (replay.search.eta)", ["point"],
            registry=r,
        )
        self.point_info = Gauge(
            "planner_point_info", "The sweep point's configuration (always 1)", ["point", "model", *POINT_INFO_KEYS], registry=r
        )
        self.safe_concurrency_per_gpu = Gauge(
            "planner_safe_concurrency_per_gpu", "Safe concurrency per GPU found for a finished point", ["point"], registry=r
        )
        self.knee_band_per_gpu = Gauge(
            "planner_knee_band_per_gpu",
            "A finished point's knee band per GPU, read from every step (low: every step at and below it"
            " passed; high: the highest load that passed at all); the safe concurrency lies below it",
            ["point", "edge"], registry=r,
        )
        self.point_node = Gauge(
            "planner_point_node_info", "Where a sweep point runs on a Ray cluster (always 1)", ["point", "node", "gpu_model"],
            registry=r,
        )
        self._point = DEFAULT_POINT
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def point(self) -> str:
        return self._point

    # --- serving -------------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve /metrics on host:port in a daemon thread; port 0 picks a free one. Returns the port."""
        if self._server is not None:
            raise ConfigError("the metrics server is already running")
        if not 0 <= port <= 65535:
            raise ConfigError(f"--metrics-port {port}: must be between 1 and 65535 (0 picks a free port)")
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-host {host} --metrics-port {port}: cannot listen ({exc.strerror or exc})") from None
        return int(self._server.server_address[1])

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server_address[1])

    def stop(self) -> None:
        """Stop serving; a second call does nothing."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> PlannerMetrics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the sweep -----------------------------------------------------------------------------

    def point_started(self, point_id: str, config: dict[str, Any], model: str) -> None:
        self._point = point_id
        labels = {k: _label(config.get(k)) for k in POINT_INFO_KEYS}
        self.point_info.labels(point=point_id, model=model, **labels).set(1)
        self.inflight.labels(point=point_id).set(0)

    def use_point(self, point_id: str) -> None:
        """The point the next calls belong to: on a cluster several points report at once."""
        self._point = point_id

    def point_placed(self, point_id: str, node: str, gpu_model: str | None) -> None:
        self.point_node.labels(point=point_id, node=node, gpu_model=_label(gpu_model)).set(1)

    def point_finished(
        self, point_id: str, safe_concurrency_per_gpu: float | None,
        knee_band_per_gpu: tuple[float | None, float | None] | None = None,
    ) -> None:
        # No series for a point without a safe concurrency: a 0 would read as "measured, carries nothing".
        if safe_concurrency_per_gpu is not None:
            self.safe_concurrency_per_gpu.labels(point=point_id).set(safe_concurrency_per_gpu)
        # Likewise for an edge of the band the steps did not give.
        for edge, value in zip(("low", "high"), knee_band_per_gpu or (None, None)):
            if value is not None:
                self.knee_band_per_gpu.labels(point=point_id, edge=edge).set(value)
        for gauge in (self.target_concurrency, self.target_rate, self.search_eta):
            _remove(gauge, point_id)

    # --- the replay observer -------------------------------------------------------------------

    def step_started(self, load: LoadSpec) -> None:
        if load.mode == "concurrency":
            self.target_concurrency.labels(point=self._point).set(load.value)
            _remove(self.target_rate, self._point)
        elif load.mode == "rate":
            self.target_rate.labels(point=self._point).set(load.value)
            _remove(self.target_concurrency, self._point)
        else:
            _remove(self.target_concurrency, self._point)
            _remove(self.target_rate, self._point)

    def request_sent(self) -> None:
        self.inflight.labels(point=self._point).inc()

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None:
        point = self._point
        self.inflight.labels(point=point).dec()
        self.requests.labels(point=point, status="ok" if record.ok else str(record.error)).inc()
        if not measured or not record.ok:
            return
        if record.ttft_s is not None:
            self.ttft.labels(point=point).observe(record.ttft_s)
        itl = self.itl.labels(point=point)
        times = record.token_times_s
        bursts = 0
        for earlier, later in zip(times, times[1:]):
            if later - earlier < CLOCK_RESOLUTION_S:
                bursts += 1
            else:
                itl.observe(later - earlier)
        # Counted even when zero, so the series exists from the first measured request: the
        # dashboard's bursts panel then shows 0 rather than "No data" on a server that has none.
        self.itl_burst_gaps.labels(point=point).inc(bursts)
        tokens = record.completion_tokens if record.completion_tokens is not None else len(times)
        if record.first_token_s is not None and tokens > 1:
            self.tpot.labels(point=point).observe((record.end_s - record.first_token_s) / (tokens - 1))
        self.e2e.labels(point=point).observe(record.e2e_s)

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None:
        if search_eta_s is None:
            _remove(self.search_eta, self._point)
        else:
            self.search_eta.labels(point=self._point).set(search_eta_s)

    def step_finished(self, step: StepResult) -> None:
        point = self._point
        self.step_slo_pass.labels(point=point).set(1 if step.slo_pass else 0)
        self.steps.labels(point=point, slo_pass="true" if step.slo_pass else "false").inc()
        self.step_requests_per_s.labels(point=point).set(step.requests_per_s)
        self.step_output_tokens_per_s.labels(point=point).set(step.output_tokens_per_s)


def _label(value: Any) -> str:
    return "" if value is None else str(value)


def _remove(gauge: Gauge, point: str) -> None:
    try:
        gauge.remove(point)
    except KeyError:
        pass
