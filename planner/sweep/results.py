"""The sweep's results schema (sweep.json). Rewritten atomically as its points change."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, model_serializer, model_validator

from planner.capacity import Capacity, Failure
from planner.estimate import Estimate
from planner.sweep.disk import NO_SPACE, ResultsNotWritten
from replay.errors import SloSpecError
from replay.identity import Identity
from replay.model import ResultModel
from replay.results import PassPoint, StepResult, with_older_defaults, write_json_atomic
from replay.slo import rules as slo_mod

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


class NotPredicted(ResultModel):
    """Why a point has no estimate; sweep.json keeps it as the point's prediction ({"error": ...})."""

    model_config = ConfigDict(extra="forbid")

    # Why the estimate could not be made.
    error: str


class NodeRank(ResultModel):
    """One node of a point that vLLM spreads over several ([grid.extra] nnodes): rank 0 serves the
    API and is replayed against; the others run vLLM headless."""

    # vLLM's node rank (0 serves the API).
    rank: int
    # The Ray node's id.
    node_id: str | None = None
    # The node's hostname.
    node_hostname: str | None = None
    # The GPUs Ray gave this rank.
    gpu_ids: list[str] = Field(default_factory=list)
    # Their model.
    gpu_model: str | None = None
    # Rank 0's log is the point's log_path; the others' beside it.
    log_path: str | None = None
    # The rank's server exit code, once it exited.
    exit_code: int | None = None


class Dominance(ResultModel):
    """Why a dominated point could not win: the best safe concurrency it could ever reach, from its
    bound, is at or below a confirmed point's."""

    # The confirmed point that dominates it.
    by: str
    # That point's confirmed safe concurrency per GPU.
    by_safe_concurrency_per_gpu: float
    # The point's upper bound on concurrency: the search never measures above it.
    bound: int
    # Where the bound came from: "server_kv_pool" (the search ceiling from the KV pool its server
    # reported: the point was started, not searched) or "max_concurrency" ([replay]
    # max_concurrency: the point was not started).
    bound_source: Literal["server_kv_pool", "max_concurrency"]
    # floor(bound x (1 - headroom)) / GPUs: the most this point could ever be recommended at.
    bound_safe_concurrency_per_gpu: float


class ClassLaw(ResultModel):
    """A speed class's latency law, from one full search of one of its points (planner.sweep.laws)."""

    # The class (c1, c2, ...).
    speed_class: str
    # The searched point the law comes from.
    from_point: str
    # That search's highest pass: the class passes up to it.
    max_passing: int | None
    # That search's lowest failure, when a latency rule broke with every request running; None:
    # the law says nothing above max_passing (nothing failed, or the failure was the point's memory).
    min_failing: int | None
    # Where the fitted ratios cross 1 (the lowest crossing over the latency rules), None when none does.
    knee: float | None
    # Per latency rule: the measured steps as [concurrency, measured / bound].
    measured: dict[str, list[list[float]]] = Field(default_factory=dict)
    # Per latency rule: the isotonic fit of those ratios, as [concurrency, fitted ratio].
    fitted: dict[str, list[list[float]]] = Field(default_factory=dict)
    # Per latency rule: where its fit crosses 1 (None: it holds everywhere measured).
    crossings: dict[str, float | None] = Field(default_factory=dict)
    # Where the searched point's KV pool stopped it, as a share of its KV ceiling: [max_passing,
    # lowest failure - 1] / ceiling, when that failure broke a memory rule (kv_cache_usage_max,
    # max_preemptions) under a ceiling the KV pool set. A point of the class with another pool
    # fills it to the same rules near the same share of its own ceiling (same corpus, same rules):
    # its KV knee (planner.sweep.laws). None: the search did not meet its pool, or the file predates it.
    kv_knee_fraction: list[float] | None = None
    # That ceiling (the searched point's search_upper_bound), with kv_knee_fraction: how far below
    # its ceiling the pool filled, in requests, which scales a smaller pool's knee. None in files
    # written before it: the share alone then predicts.
    kv_knee_ceiling: int | None = None


class KneePrediction(ResultModel):
    """A point's max passing concurrency as its class's law predicts it: min(latency knee, the
    point's KV ceiling, max_num_seqs, [replay] max_concurrency)."""

    # The predicted max passing concurrency.
    concurrency: int
    # [lowest, highest] the max passing concurrency can be under the law (highest None: unbounded).
    interval: list[int | None]
    # What sets `concurrency`: "latency" (the law), "kv_knee" (where the point's pool fills to the KV
    # rules, from the law's kv_knee_fraction: planner.sweep.laws), "kv_pool" (its ceiling, without
    # that fraction), "max_num_seqs" or "max_concurrency".
    limit: str
    # The class whose law made the prediction.
    speed_class: str
    # The searched point that law comes from.
    law_from: str
    # Whether the point's KV pool was read from its server (False: not started).
    kv_pool_read: bool = False
    # None: not verified (the point was not launched, or was searched without verifying);
    # True: the verification steps agreed; False: they did not and the point was searched in full.
    verified: bool | None = None


class PointPlan(ResultModel):
    """What the adaptive strategy asks of a point it launches (read where the point runs)."""

    # The best confirmed safe concurrency per GPU when the point was launched: a point whose bound,
    # read from its server, cannot beat it is settled as dominated without a search (None: no best yet).
    beat_safe_concurrency_per_gpu: float | None = None
    # The point that holds that best.
    beat_by: str | None = None
    # The class's law: verify its prediction rather than search (None: search in full).
    law: ClassLaw | None = None
    # The point's speed class.
    speed_class: str | None = None
    # The point's max_num_seqs, when it caps what passes (the SLOs see requests waiting for a slot).
    max_num_seqs: int | None = None
    # [replay] max_concurrency, which caps every search.
    max_concurrency: int | None = None
    # [sweep] verify_predictions = "all": verify the class's prediction even where the point
    # cannot win (never settled as dominated or predicted).
    verify_all: bool = False


class PointResult(ResultModel):
    # The point's id: its number and axis values (01-mml12288-...).
    id: str
    # The point's axis values: flag names in underscore form (max_model_len, gpu_memory_utilization,
    # tensor_parallel_size, and every [grid.extra] flag) plus "env" for [grid.env] axes.
    config: dict[str, Any]
    # The server command as run, secrets redacted.
    command: list[str]
    # ok, infeasible, failed, predicted_infeasible; pending or running while a sweep runs.
    status: PointStatus
    # What --resume compares: model, vLLM version, command, flags, env axes, corpus sha256, SLOs and
    # replay settings.
    fingerprint: str
    # When the point started (UTC, ISO 8601).
    started_at: str | None = None
    # The point's wall time, start-up included.
    duration_s: float | None = None
    # Seconds from spawning the server to /health answering (what a deployment's start-up probe
    # must allow); absent in older files.
    startup_s: float | None = None
    # The server's /version.
    vllm_version: str | None = None
    # The KV-cache capacity the server reported (its log and vllm:cache_config_info).
    capacity: Capacity = Field(default_factory=Capacity)
    # Why the point is infeasible or failed.
    failure: Failure | None = None
    # The corpus-aware KV bound, never below vLLM's reported max concurrency (and never above
    # [replay] max_concurrency): every request's blocks counted, as if nothing were cached.
    concurrency_upper_bound: int | None = None
    # The mean KV blocks a corpus request occupies (prompt plus output, rounded up to blocks).
    mean_blocks_per_request: float | None = None
    # vLLM's prefix cache: on unless the point's args say --no-enable-prefix-caching. With it, the
    # bound that holds a block shared by requests in flight once (replay.prefix.bound.
    # prefix_aware_bound), from the distinct shared prompt blocks and each request's own blocks.
    prefix_caching: bool | None = None
    # The bound with blocks that requests share held once (never below concurrency_upper_bound).
    concurrency_upper_bound_prefix_cache: int | None = None
    # Distinct prompt blocks held by two or more corpus requests.
    shared_prefix_blocks: int | None = None
    # The mean blocks a request holds on its own (unshared prompt blocks, partial last block,
    # output).
    mean_own_blocks_per_request: float | None = None
    # The ceiling the search started from: the prefix-cache bound when there is one, else the
    # other, capped by [replay] max_concurrency.
    search_upper_bound: int | None = None
    # Every step of the point's search, in the order run (as in replay.json).
    steps: list[StepResult] = Field(default_factory=list)
    # The highest concurrency whose steps passed.
    max_passing_concurrency: int | None = None
    # The lowest concurrency that failed or was inconclusive.
    min_failing_concurrency: int | None = None
    # floor(base x (1 - headroom)), base being the load answer_basis names: knee_fit (the knee
    # read from every step) in files written since the fit; the start majority for a point
    # measured on several server starts; max_passing_concurrency in older files.
    safe_concurrency: int | None = None
    # Which load safe_concurrency was read at: "knee_fit"; "start_majority" (the load that held on
    # more than half of the server starts, each start's own knee in start_knees); or "max_passing"
    # (the search's highest pass below its lowest failure). Absent in files written before the
    # fit: max_passing.
    answer_basis: Literal["knee_fit", "start_majority", "max_passing"] | None = None
    # Each server start's own knee, by start ("1", "2", ...): the fit over that start's steps alone
    # ([sweep] server_starts). Null for a point measured on one start, and in files written before
    # the majority: their answer is knee_fit over the starts' steps pooled.
    start_knees: dict[int, int | None] | None = None
    # GPUs the point holds: tensor_parallel_size x pipeline_parallel_size.
    gpus: int = 1
    # The GPUs it ran on (CUDA_VISIBLE_DEVICES).
    gpu_ids: list[str] = Field(default_factory=list)
    # Where the point ran: the GPUs' model (nvidia-smi's name, else Ray's accelerator type) and,
    # with the Ray executor, the node's Ray id and hostname.
    gpu_model: str | None = None
    # The Ray node's id (Ray executor).
    node_id: str | None = None
    # The Ray node's hostname (Ray executor).
    node_hostname: str | None = None
    # A point across nodes: every node it ran on, rank 0 first (node_id, node_hostname and gpu_ids
    # above are rank 0's, gpu_model every rank's). Empty for a point on one node.
    ranks: list[NodeRank] = Field(default_factory=list)
    # safe_concurrency / gpus: what the recommendation ranks by.
    safe_concurrency_per_gpu: float | None = None
    # Output tokens/s per GPU at the safe concurrency (measured there, or interpolated between the
    # steps around it).
    output_tokens_per_s_per_gpu: float | None = None
    # The SLOs the lowest failing step broke, or kv_capacity_bound (max_concurrency) when the whole
    # bound passed.
    binding_constraint: str | None = None
    # Rules undecided at the lowest failing step, apart from the binding constraint (they did not
    # bind): "tpot_p90_ms: undecided after 13 requests" (replay.search.binding).
    binding_undecided: list[str] = Field(default_factory=list)
    # max_passing_concurrency passed again on fresh prompts; the knee lies in knee_interval
    # [highest conclusive pass, lowest conclusive fail]. Absent in older files.
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
    # Concurrencies whose every step ran out of time before it could resolve (never failures),
    # and whether [replay] point_budget_s stopped the search before it was done.
    unresolved_concurrency: list[int] = Field(default_factory=list)
    # [replay] point_budget_s stopped the search before it was done.
    budget_exhausted: bool = False
    # Concurrencies whose every step was disturbed (replay.step.environment).
    disturbed_concurrency: list[int] = Field(default_factory=list)
    # [replay] allow_interference: the environment was recorded, no step was called disturbed.
    interference_allowed: bool = False
    # Peak used memory per GPU over the point's steps, and what was left of each GPU's total.
    gpu_memory_peak_mib: dict[str, float] | None = None
    # What was left of each GPU's total memory at that peak, in MiB.
    gpu_memory_headroom_mib: dict[str, float] | None = None
    # From `planner estimate` before launching (see planner.estimate); None when not predicted.
    # An older planner's estimate that no longer parses is kept as it was saved (the dict).
    prediction: Estimate | NotPredicted | dict[str, Any] | None = None
    # The estimate's KV tokens for the point.
    kv_cache_tokens_predicted: int | None = None
    # (predicted - reported) / reported KV tokens.
    kv_cache_tokens_relative_error: float | None = None
    # The server's log (points/<id>/server.log).
    log_path: str | None = None
    # What happened to the point without ending it (metrics_lost: ..., see docs/reference/faults.md).
    notes: list[str] = Field(default_factory=list)
    # The point's speed class (planner.sweep.classes): c1, c2, ... Null in older files.
    speed_class: str | None = None
    # How its answer was reached: "searched", "verified", "predicted" or "dominated" (AnswerSource;
    # [sweep] strategy). Null in older files and while pending.
    answer_source: AnswerSource | None = None
    # Why a point was not searched, in words (dominated or predicted).
    answer_note: str | None = None
    # A dominated point's bound and the point that dominates it.
    dominance: Dominance | None = None
    # The class law's prediction for the point, its interval and how its verification went.
    knee_prediction: KneePrediction | None = None
    # What the adaptive strategy asked of the point when it launched it.
    plan: PointPlan | None = None


class Best(ResultModel):
    # The recommended point.
    point_id: str
    # Its safe concurrency per GPU.
    safe_concurrency_per_gpu: float
    # Its output tokens/s per GPU (the tie-breaker).
    output_tokens_per_s_per_gpu: float | None = None
    # Why it won.
    reason: str
    # Why every other point lost, keyed by point id.
    others: dict[str, str] = Field(default_factory=dict)


class CorpusInfo(ResultModel):
    # The corpus file.
    path: str
    # Its SHA-256.
    sha256: str
    # Requests read from it.
    requests: int


class CpuSplitInfo(ResultModel):
    # The CPUs the servers were pinned to.
    server: list[int]
    # The CPUs the planner kept.
    client: list[int]


class RunInfo(ResultModel):
    """What this run found rather than what it was told: the corpus, vLLM's version, the GPUs."""

    # The prompt corpus.
    corpus: CorpusInfo | None = None
    # vLLM's version, asked of the server command.
    vllm_version: str | None = None
    # The GPUs found on this machine.
    gpus_found: list[str] = Field(default_factory=list)
    # When [cpus] pins: the CPUs the servers and the planner itself were given.
    cpus_split: CpuSplitInfo | None = None


# Version 1 kept RunInfo's keys inside `settings`.
_RUN_KEYS_IN_V1_SETTINGS = ("corpus", "vllm_version", "gpus_found")


class _Saved(ResultModel):
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

    # [server] model.
    model: str | None = None


class SavedSlo(_Saved):
    """[slo] as saved: headroom and one bound per SLO key."""

    # [slo] headroom.
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

    # The [server] table.
    server: SavedServer = Field(default_factory=SavedServer)
    # The [slo] table.
    slo: SavedSlo = Field(default_factory=SavedSlo)


class FreshServerCheck(ResultModel):
    """The recommended point measured once more on a fresh server, at its safe concurrency
    (planner.sweep.fresh)."""

    # The recommended point.
    point_id: str
    # Its safe concurrency, measured once more.
    concurrency: int
    # When the fresh server was started.
    started_at: str | None = None
    # True: the step passed on the fresh server; False: it did not (searched_again holds the new
    # search); None: not measured (note says why).
    held: bool | None = None
    # Every step on the fresh server (more than one when a step was disturbed).
    steps: list[StepResult] = Field(default_factory=list)
    # When it did not hold: the point searched again on a new start (its id ends in -fresh).
    searched_again: PointResult | None = None
    # The fresh server's log, relative to the results folder.
    log_path: str | None = None
    # Why it was not measured, or why it stopped.
    note: str | None = None


class SpeedClassInfo(ResultModel):
    """One speed class of the grid (planner.sweep.classes) and, under the adaptive strategy, its law."""

    # c1, c2, ... in the order the grid first reaches each class.
    id: str
    # The axis values that name the class ("every point" when nothing but memory varies).
    label: str
    # Its points, in grid order.
    point_ids: list[str]
    # Its law, from its first full search (adaptive only).
    law: ClassLaw | None = None


class AdaptiveSummary(ResultModel):
    """How the adaptive strategy answered the grid's points, counted."""

    # Points searched in full (fallbacks included).
    searched: int = 0
    # Points whose prediction two steps and the confirmation verified.
    verified: int = 0
    # Points settled by their class's law, not searched.
    predicted: int = 0
    # Points settled by their own bound, not searched.
    dominated: int = 0
    # Verifications that disagreed with the prediction, each followed by a full search.
    fallbacks: int = 0


class SweepResults(ResultModel):
    # The file's format version.
    schema_version: int = SCHEMA_VERSION
    # When the sweep started (UTC, ISO 8601).
    started_at: str
    # The sweep settings as given (secrets replaced by "***"; see planner.sweep.config.public_settings).
    settings: SavedSettings
    # What this run found: the corpus, vLLM's version, the GPUs.
    run: RunInfo = Field(default_factory=RunInfo)
    # What was measured: vLLM, the model, the server's flags and env, the hardware, the corpus,
    # the SLOs, the planner (None in files before version 3: unknown).
    identity: Identity | None = None
    # Every grid point, in grid order.
    points: list[PointResult] = Field(default_factory=list)
    # The recommended point: the highest safe concurrency per GPU, ties broken by output tokens/s
    # per GPU.
    best: Best | None = None
    # [sweep] confirm_fresh_server: the recommended point's answer on a fresh server.
    fresh_server: FreshServerCheck | None = None
    # The sweep was stopped (Ctrl-C or SIGTERM); finished points and steps are kept.
    interrupted: bool = False
    # [sweep] strategy: "exhaustive" or "adaptive" (null in older files).
    strategy: str | None = None
    # The grid's speed classes (planner.sweep.classes), with their laws under adaptive.
    speed_classes: list[SpeedClassInfo] = Field(default_factory=list)
    # How the adaptive strategy answered the points, counted (null under exhaustive).
    adaptive: AdaptiveSummary | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_older_versions(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if isinstance(data.get("settings"), dict) and isinstance(data["settings"].get("replay"), dict):
            data = {**data, "settings": {**data["settings"], "replay": with_older_defaults(data["settings"]["replay"])}}
        if data.get("schema_version") not in (1, 2):
            return data
        if data["schema_version"] == 1 and isinstance(data.get("settings"), dict):
            settings = dict(data["settings"])
            run = {k: settings.pop(k) for k in _RUN_KEYS_IN_V1_SETTINGS if k in settings}
            data = {**data, "settings": settings, "run": run}
        # Version 2 lacks only `identity`, which stays None (unknown).
        return {**data, "schema_version": SCHEMA_VERSION}


def write_results(output_dir: Path, results: SweepResults) -> None:
    """Rewrite sweep.json atomically; a full disk raises ResultsNotWritten (planner.sweep.disk) and
    leaves the previous file as it was."""
    path = output_dir / RESULTS_FILE
    data = results.model_dump(mode="json")
    try:
        write_json_atomic(path, data)
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        raise ResultsNotWritten.no_space(path, data, exc) from None
