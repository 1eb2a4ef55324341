"""The sweep's results schema (sweep.json). Rewritten atomically as its points change."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_serializer, model_validator

from planner.capacity import Capacity, Failure
from planner.estimate import Estimate
from replay import slo as slo_mod
from replay.errors import SloSpecError
from replay.identity import Identity
from replay.results import StepResult, write_json_atomic

RESULTS_FILE = "sweep.json"

# 2: the run's corpus, vLLM version and GPUs moved from `settings` to `run` (RunInfo).
# 3: `identity`, what the run measured (replay.identity); older files load without it.
SCHEMA_VERSION = 3

# pending and running appear only while a sweep runs (or in the file of one that was killed).
# dominated and predicted: the adaptive strategy settled the point without searching it
# (planner.sweep.adaptive; answer_source says the same, with the why beside it).
PointStatus = Literal[
    "ok", "infeasible", "failed", "predicted_infeasible", "dominated", "predicted", "pending", "running"
]

# How a point's answer was reached ([sweep] strategy; docs/guides/adaptive-sweep.md): "searched"
# (a full search), "verified" (its class's prediction, confirmed by steps on the point itself),
# "predicted" (the class's law says it cannot beat the best confirmed point: not searched) or
# "dominated" (its own upper bound cannot beat the best confirmed point: not searched).
AnswerSource = Literal["searched", "verified", "predicted", "dominated"]

# Start-up failures that say the configuration cannot run (status "infeasible"), as opposed to a
# broken launch (status "failed").
INFEASIBLE_KINDS = frozenset(
    {
        "kv_too_small",
        "no_kv_memory",
        "gpu_oom",
        "world_size_too_large",
        "heads_not_divisible",
        "max_model_len_too_long",
        "not_enough_gpus",
    }
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NotPredicted(_Model):
    """Why a point has no estimate; sweep.json keeps it as the point's prediction ({"error": ...})."""

    model_config = ConfigDict(extra="forbid")

    error: str


class NodeRank(_Model):
    """One node of a point that vLLM spreads over several ([grid.extra] nnodes): rank 0 serves the
    API and is replayed against; the others run vLLM headless."""

    rank: int
    node_id: str | None = None
    node_hostname: str | None = None
    gpu_ids: list[str] = Field(default_factory=list)
    gpu_model: str | None = None
    # Rank 0's log is the point's log_path; the others' beside it.
    log_path: str | None = None
    exit_code: int | None = None


class Dominance(_Model):
    """Why a dominated point could not win: the best safe concurrency it could ever reach, from its
    bound, is at or below a confirmed point's."""

    # The confirmed point that dominates it, and that point's safe concurrency per GPU.
    by: str
    by_safe_concurrency_per_gpu: float
    # The point's upper bound on concurrency and where it came from: "server_kv_pool" (the search
    # ceiling from the KV pool its server reported: the point was started, not searched) or
    # "max_concurrency" ([replay] max_concurrency: not started).
    bound: int
    bound_source: Literal["server_kv_pool", "max_concurrency"]
    # floor(bound x (1 - headroom)) / GPUs: the most this point could ever be recommended at.
    bound_safe_concurrency_per_gpu: float


class ClassLaw(_Model):
    """A speed class's latency law, from one full search of one of its points (planner.sweep.laws)."""

    speed_class: str
    # The searched point the law comes from.
    from_point: str
    # That search's knee: its highest pass and lowest failure (None: nothing failed below its
    # ceiling, so the law says only that the SLOs hold up to max_passing).
    max_passing: int | None
    min_failing: int | None
    # Where the fitted ratios cross 1 (the lowest crossing over the latency rules), None when none does.
    knee: float | None
    # Per latency rule: the measured steps as [concurrency, measured / bound] and the isotonic fit at
    # the same concurrencies, and where that rule's fit crosses 1.
    measured: dict[str, list[list[float]]] = Field(default_factory=dict)
    fitted: dict[str, list[list[float]]] = Field(default_factory=dict)
    crossings: dict[str, float | None] = Field(default_factory=dict)


class KneePrediction(_Model):
    """A point's max passing concurrency as its class's law predicts it: min(latency knee, the
    point's KV ceiling, max_num_seqs, [replay] max_concurrency)."""

    concurrency: int
    # [lowest, highest] the max passing concurrency can be under the law (highest None: unbounded).
    interval: list[int | None]
    # What sets `concurrency`: "latency" (the law), "kv_pool", "max_num_seqs" or "max_concurrency".
    limit: str
    speed_class: str
    law_from: str
    # Whether the point's KV pool was read from its server (False: not started).
    kv_pool_read: bool = False
    # None: not verified (the point was not launched, or was searched without verifying);
    # True: the verification steps agreed; False: they did not and the point was searched in full.
    verified: bool | None = None


class PointPlan(_Model):
    """What the adaptive strategy asks of a point it launches (read where the point runs)."""

    # The best confirmed safe concurrency per GPU so far, and its point: a point whose bound, read
    # from its server, cannot beat it is settled as dominated without a search (None: no best yet).
    beat_safe_concurrency_per_gpu: float | None = None
    beat_by: str | None = None
    # The class's law: verify its prediction rather than search (None: search in full).
    law: ClassLaw | None = None
    speed_class: str | None = None
    max_num_seqs: int | None = None
    max_concurrency: int | None = None


class PointResult(_Model):
    id: str
    # The point's axis values: flag names in underscore form (max_model_len, gpu_memory_utilization,
    # tensor_parallel_size, and every [grid.extra] flag) plus "env" for [grid.env] axes.
    config: dict[str, Any]
    command: list[str]
    status: PointStatus
    fingerprint: str
    started_at: str | None = None
    duration_s: float | None = None
    vllm_version: str | None = None
    capacity: Capacity = Field(default_factory=Capacity)
    failure: Failure | None = None
    # The corpus-aware KV bound, never below vLLM's reported max concurrency (and never above
    # [replay] max_concurrency): every request's blocks counted, as if nothing were cached.
    concurrency_upper_bound: int | None = None
    mean_blocks_per_request: float | None = None
    # vLLM's prefix cache: on unless the point's args say --no-enable-prefix-caching. With it, the
    # bound that holds a block shared by requests in flight once (planner.sweep.bound.
    # prefix_aware_bound), from the distinct shared prompt blocks and each request's own blocks.
    prefix_caching: bool | None = None
    concurrency_upper_bound_prefix_cache: int | None = None
    shared_prefix_blocks: int | None = None
    mean_own_blocks_per_request: float | None = None
    # The ceiling the search started from: the prefix-cache bound when there is one, else the
    # other, capped by [replay] max_concurrency.
    search_upper_bound: int | None = None
    steps: list[StepResult] = Field(default_factory=list)
    max_passing_concurrency: int | None = None
    min_failing_concurrency: int | None = None
    safe_concurrency: int | None = None
    gpus: int = 1
    gpu_ids: list[str] = Field(default_factory=list)
    # Where the point ran: the GPUs' model (nvidia-smi's name, else Ray's accelerator type) and,
    # with the Ray executor, the node's Ray id and hostname.
    gpu_model: str | None = None
    node_id: str | None = None
    node_hostname: str | None = None
    # A point across nodes: every node it ran on, rank 0 first (node_id, node_hostname and gpu_ids
    # above are rank 0's, gpu_model every rank's). Empty for a point on one node.
    ranks: list[NodeRank] = Field(default_factory=list)
    safe_concurrency_per_gpu: float | None = None
    output_tokens_per_s_per_gpu: float | None = None
    binding_constraint: str | None = None
    # max_passing_concurrency passed again on fresh prompts; the knee lies in knee_interval
    # [highest conclusive pass, lowest conclusive fail]. Absent in older files.
    confirmed: bool | None = None
    knee_interval: list[int | None] | None = None
    # Concurrencies whose every step ran out of time before it could resolve (never failures),
    # and whether [replay] point_budget_s stopped the search before it was done.
    unresolved_concurrency: list[int] = Field(default_factory=list)
    budget_exhausted: bool = False
    # Peak used memory per GPU over the point's steps, and what was left of each GPU's total.
    gpu_memory_peak_mib: dict[str, float] | None = None
    gpu_memory_headroom_mib: dict[str, float] | None = None
    # From `planner estimate` before launching (see planner.estimate); None when not predicted.
    # An older planner's estimate that no longer parses is kept as it was saved (the dict).
    prediction: Estimate | NotPredicted | dict[str, Any] | None = None
    kv_cache_tokens_predicted: int | None = None
    kv_cache_tokens_relative_error: float | None = None
    log_path: str | None = None
    # [sweep] strategy (issue 28). Null in older files and while pending.
    speed_class: str | None = None
    answer_source: AnswerSource | None = None
    # Why a point was not searched, in words (dominated or predicted).
    answer_note: str | None = None
    dominance: Dominance | None = None
    knee_prediction: KneePrediction | None = None
    plan: PointPlan | None = None


class Best(_Model):
    point_id: str
    safe_concurrency_per_gpu: float
    output_tokens_per_s_per_gpu: float | None = None
    reason: str
    # Why every other point lost, keyed by point id.
    others: dict[str, str] = Field(default_factory=dict)


class CorpusInfo(_Model):
    path: str
    sha256: str
    requests: int


class CpuSplitInfo(_Model):
    server: list[int]
    client: list[int]


class RunInfo(_Model):
    """What this run found rather than what it was told: the corpus, vLLM's version, the GPUs."""

    corpus: CorpusInfo | None = None
    vllm_version: str | None = None
    gpus_found: list[str] = Field(default_factory=list)
    # When [cpus] pins: the CPUs the servers and the planner itself were given.
    cpus_split: CpuSplitInfo | None = None


# Version 1 kept RunInfo's keys inside `settings`.
_RUN_KEYS_IN_V1_SETTINGS = ("corpus", "vllm_version", "gpus_found")


class _Saved(_Model):
    """A section saved as given: any keys, written back in the order they came in (typed fields
    would otherwise go first)."""

    model_config = ConfigDict(extra="allow")
    _order: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: Any) -> Any:
        model = handler(data)
        if isinstance(data, dict):
            model._order = list(data)
        return model

    @model_serializer(mode="wrap")
    def _in_saved_order(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        place = {k: i for i, k in enumerate(self._order)}
        return dict(sorted(out.items(), key=lambda kv: place.get(kv[0], len(place))))


class SavedServer(_Saved):

    model: str | None = None


class SavedSlo(_Saved):
    """[slo] as saved: headroom and one bound per SLO key."""

    headroom: float | None = None

    def bounds(self) -> dict[str, float]:
        """The SLO bounds, by key (those this planner knows; a file may come from another one)."""
        out = {}
        for key, bound in (self.model_extra or {}).items():
            try:
                slo_mod.check_key(key)
            except SloSpecError:
                continue
            if isinstance(bound, int | float):
                out[key] = float(bound)
        return out


class SavedSettings(_Saved):
    """The sweep settings as saved (planner.sweep.config.public_settings): every section is kept;
    those the report reads are typed."""

    server: SavedServer = Field(default_factory=SavedServer)
    slo: SavedSlo = Field(default_factory=SavedSlo)


class SpeedClassInfo(_Model):
    """One speed class of the grid (planner.sweep.classes) and, under the adaptive strategy, its law."""

    id: str
    label: str
    point_ids: list[str]
    law: ClassLaw | None = None


class AdaptiveSummary(_Model):
    """How the adaptive strategy answered the grid's points, counted."""

    searched: int = 0
    verified: int = 0
    predicted: int = 0
    dominated: int = 0
    # Verifications that disagreed with the prediction, each followed by a full search.
    fallbacks: int = 0


class SweepResults(_Model):
    schema_version: int = SCHEMA_VERSION
    started_at: str
    # The sweep settings as given (secrets replaced by "***"; see planner.sweep.config.public_settings).
    settings: SavedSettings
    run: RunInfo = Field(default_factory=RunInfo)
    # What was measured: vLLM, the model, the server's flags and env, the hardware, the corpus,
    # the SLOs, the planner (None in files before version 3: unknown).
    identity: Identity | None = None
    points: list[PointResult] = Field(default_factory=list)
    best: Best | None = None
    interrupted: bool = False
    # [sweep] strategy, the grid's speed classes, and the adaptive strategy's counts (null in older files).
    strategy: str | None = None
    speed_classes: list[SpeedClassInfo] = Field(default_factory=list)
    adaptive: AdaptiveSummary | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_older_versions(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("schema_version") not in (1, 2):
            return data
        if data["schema_version"] == 1 and isinstance(data.get("settings"), dict):
            settings = dict(data["settings"])
            run = {k: settings.pop(k) for k in _RUN_KEYS_IN_V1_SETTINGS if k in settings}
            data = {**data, "settings": settings, "run": run}
        # Version 2 lacks only `identity`, which stays None (unknown).
        return {**data, "schema_version": SCHEMA_VERSION}


def write_results(output_dir: Path, results: SweepResults) -> None:
    write_json_atomic(output_dir / RESULTS_FILE, results.model_dump(mode="json"))
