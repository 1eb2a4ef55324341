"""Sweep settings: the TOML file, then PLANNER_* environment variables, then CLI flags.

Every table forbids unknown keys, so a misspelled key is an error that names the key, where it
is in the file, and the keys that are valid there.
"""

from __future__ import annotations

import re
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from planner.errors import ConfigError
from planner.redaction import REDACTED, redact, redact_env
from planner.vllm_args import config_key, fixed_flags, has_flag
from replay.errors import SloSpecError
from replay.run.settings import ReplaySettings
from replay.slo import rules as slo_mod

# The file being read: pydantic-settings builds its sources from the class, so the path of this
# one load travels beside it rather than on the class.
_toml_path: ContextVar[Path | None] = ContextVar("_toml_path", default=None)

ENV_PREFIX = "PLANNER_"


def _relative_to_config(value: str) -> str:
    path = _toml_path.get()
    if path is not None and value.startswith(("./", "../")):
        return str((Path(path).resolve().parent / value).resolve())
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# vLLM's multi-node flags (--nnodes N on every node, one rank per node) that the planner gives
# each rank of a point itself: which rank it is, where rank 0 is, and the ranks without an API.
MULTINODE_FLAGS = ("--node-rank", "-r", "--master-addr", "--master-port", "--headless")


class ServerSection(_Strict):
    # The server program. The module form and a container command work the same way: the planner
    # appends --model, --host, --port and the point's flags.
    command: list[str] = Field(default_factory=lambda: ["vllm", "serve"], min_length=1)
    # The model vLLM serves (--model): a Hub name, "org/name@REVISION" to pin a revision, or a folder.
    model: str
    # vLLM flags every point gets; --model, --host, --port, --revision and the parallel sizes are refused here.
    args: list[str] = Field(default_factory=list)
    # Environment variables of every server.
    env: dict[str, str] = Field(default_factory=dict)
    # The address the server listens on and the client connects to.
    host: str = "127.0.0.1"
    # The port of every server; 0: a free port is found for every point.
    port: int = Field(default=0, ge=0, le=65535)
    # How long a server may take to answer /health before the point fails (timeout).
    startup_timeout_s: float = Field(default=900.0, gt=0)
    # Seconds between SIGTERM and SIGKILL when a server is stopped.
    stop_grace_s: float = Field(default=20.0, gt=0)
    # Passed to vLLM (as VLLM_API_KEY) and to the client; never written to results or logs.
    api_key: SecretStr | None = None

    @field_validator("model")
    @classmethod
    def _relative_to_file(cls, model: str) -> str:
        return _relative_to_config(model)

    @field_validator("args")
    @classmethod
    def _no_reserved_flags(cls, args: list[str]) -> list[str]:
        for flag in ("--model", "--host", "--port", "--revision"):
            if has_flag(args, flag):
                hint = " (write the revision after the model: model = \"org/name@REVISION\")" if flag == "--revision" else ""
                raise ValueError(f"{flag} is set by the planner; remove it from [server] args{hint}")
        for flags, key in ((("--tensor-parallel-size", "-tp"), "tensor_parallel_size"),
                           (("--pipeline-parallel-size", "-pp"), "pipeline_parallel_size")):
            if has_flag(args, *flags):
                raise ValueError(
                    f"{flags[0]} decides how many GPUs a point takes; set it in [grid] ({key} = [N]), not in [server] args"
                )
        if has_flag(args, "--nnodes", "-n"):
            raise ValueError(
                "--nnodes decides how many nodes a point spans; set it in [grid.extra] (nnodes = [N]), not in [server] args"
            )
        for flag in MULTINODE_FLAGS:
            if has_flag(args, flag):
                raise ValueError(f"{flag} is set by the planner on each node of a multi-node point; remove it from [server] args")
        return args



AxisValue = int | float | str | bool


class GridSection(_Strict):
    # vLLM's --max-model-len values; the grid is the product of every axis.
    max_model_len: list[int] = Field(default_factory=list)
    # vLLM's --gpu-memory-utilization values, fractions in (0, 1].
    gpu_memory_utilization: list[float] = Field(default_factory=list)
    # vLLM's --tensor-parallel-size values: GPUs per point (times pipeline_parallel_size).
    tensor_parallel_size: list[int] = Field(default_factory=list)
    # Any other vLLM flag, in underscore or dash form: max_num_seqs, kv_cache_dtype, kv_cache_memory_bytes, ...
    extra: dict[str, list[AxisValue]] = Field(default_factory=dict)
    # Environment variables as axes.
    env: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _fraction(cls, values: list[float]) -> list[float]:
        for v in values:
            if not 0 < v <= 1:
                raise ValueError(f"gpu_memory_utilization {v} is not a fraction in (0, 1]")
        return values

    @field_validator("max_model_len", "tensor_parallel_size")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        for v in values:
            if v < 1:
                raise ValueError(f"{v} must be >= 1")
        return values

    @model_validator(mode="after")
    def _no_empty_axes(self) -> GridSection:
        for name, values in {**self.extra, **self.env}.items():
            if not values:
                raise ValueError(f"axis {name!r} has no values")
        extra = {config_key(k): v for k, v in self.extra.items()}
        for flag in MULTINODE_FLAGS:
            if flag.startswith("--") and config_key(flag) in extra:
                raise ValueError(f"[grid.extra] {config_key(flag)}: the planner sets {flag} on each node of a multi-node point")
        for key in ("nnodes", "pipeline_parallel_size"):
            for v in extra.get(key, []):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"[grid.extra] {key}: {v!r} is not a whole number >= 1")
        # vLLM splits a point's tensor x pipeline parallel ranks evenly over its nodes.
        for tp in self.tensor_parallel_size or extra.get("tensor_parallel_size") or [1]:
            for pp in extra.get("pipeline_parallel_size", [1]):
                for nodes in extra.get("nnodes", [1]):
                    gpus = int(tp) * int(pp)
                    if gpus % nodes:
                        divisors = ", ".join(str(d) for d in range(1, gpus + 1) if gpus % d == 0)
                        raise ValueError(
                            f"[grid.extra] nnodes {nodes} does not divide the {gpus} GPUs of tensor_parallel_size {tp}"
                            f" x pipeline_parallel_size {pp}: vLLM puts the same number on each node; nnodes can be"
                            f" {divisors}"
                        )
        return self


class SloSection(_Strict):
    model_config = ConfigDict(extra="allow")
    # Keep this fraction of the highest passing concurrency free: safe = floor(max_passing * (1 - headroom)).
    headroom: float = Field(default=0.1, ge=0, lt=1)

    def rules(self) -> dict[str, float]:
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _known_slos(self) -> SloSection:
        try:
            validated = slo_mod.validate(self.model_extra or {})
        except SloSpecError as exc:
            raise ValueError(str(exc)) from None
        self.__pydantic_extra__ = validated
        return self


class GpusSection(_Strict):
    # "auto" (nvidia-smi), a list of GPU indices, or "none" to run on the CPU one point at a time.
    devices: Literal["auto", "none"] | list[str] = "auto"


class EstimateSection(_Strict):
    # Skip points the pre-flight estimate says cannot fit by a clear margin.
    prune: bool = True
    # GPU memory for the estimate when nvidia-smi cannot tell: a catalogue name or GiB.
    gpu: str | None = None
    # GPU memory in GiB for the estimate, overriding gpu.
    gpu_memory_gib: float | None = Field(default=None, gt=0)


# Ray's own forms: "auto" (the cluster this node belongs to), a Ray Client URL, or a GCS host:port.
_RAY_ADDRESS = re.compile(r"^(auto|ray://[^\s:/]+:\d+|[^\s:/]+:\d+)$")


class NodeSelector(_Strict):
    # A GPU model a point must land on: Ray's accelerator type (H100, A100, L4, ...), which Ray
    # detects on every node with NVIDIA GPUs and exposes as the resource accelerator_type:<model>.
    gpu_type: str | None = None
    # Ray custom resources (`ray start --resources '{"big-nvlink": 8}'`), asked for once per point on
    # each node it holds (a point across nodes: on every one of them).
    resources: dict[str, float] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _positive_amounts(cls, resources: dict[str, float]) -> dict[str, float]:
        for name, amount in resources.items():
            if amount <= 0:
                raise ValueError(f"resource {name!r}: amount {amount:g} must be > 0")
        return resources


class ExecutorSection(_Strict):
    # "local": points run on this machine's GPUs (planner.gpus). "ray": each point is a Ray task
    # holding a placement group of its GPUs on one node of a Ray cluster.
    kind: Literal["local", "ray"] = "local"
    # The cluster: "auto" (the one this node belongs to), "ray://HOST:10001" (Ray Client) or "HOST:6379" (the head).
    address: str = "auto"
    # Handed to ray.init as is (pip, env_vars, working_dir, container, ...).
    runtime_env: dict[str, Any] | None = None
    # Times a point is rerun after its node (or worker) was lost; a server that dies is not retried.
    max_retries: int = Field(default=1, ge=0)
    # Where points may land: a GPU model and Ray custom resources.
    node_selector: NodeSelector = Field(default_factory=NodeSelector)
    # CPUs reserved beside each point's GPUs, for the server's API process and the replay client.
    cpus_per_point: float = Field(default=1.0, ge=0)

    @field_validator("address")
    @classmethod
    def _ray_address(cls, address: str) -> str:
        if not _RAY_ADDRESS.match(address):
            raise ValueError(
                f"{address!r} is not a Ray address: use \"auto\", \"ray://HOST:PORT\" (Ray Client) or \"HOST:PORT\" (the head's GCS)"
            )
        return address
class CpusSection(_Strict):
    # Give the planner the last `client` CPUs of this machine and the server the rest (pinned, with
    # VLLM_CPU_OMP_THREADS_BIND unless [server] env sets it): for CPU servers, whose threads would
    # otherwise share cores with the client's timing. 0 pins nothing.
    client: int = Field(default=0, ge=0)


# The flags that change only memory by default (planner.sweep.classes says why).
DEFAULT_MEMORY_ONLY_FLAGS = (
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "max_model_len",
    "num_gpu_blocks_override",
    "max_num_seqs",
)


# [sweep]: how the grid is searched (issue 28). "exhaustive" searches every point in full; "adaptive"
# orders points by their bound, skips those that cannot win and predicts a speed class's other
# points from one full search, verifying each prediction it acts on (docs/guides/adaptive-sweep.md).
# Then the recommended point is confirmed on a fresh server (issue 29, planner.sweep.fresh).
class StrategySection(_Strict):
    # "adaptive" (the default): see docs/guides/adaptive-sweep.md; "exhaustive": every point searched
    # in full, in grid order. The benchmark (benchmarks/adaptive_sweep.py) found the same best
    # point either way on every seed, adaptive in a seventh of the time.
    strategy: Literal["exhaustive", "adaptive"] = "adaptive"
    # Flags that change only memory, never a step's speed: points that differ only in them share a
    # speed class (planner.sweep.classes). Underscore or dash form.
    memory_only_flags: list[str] = Field(default_factory=lambda: list(DEFAULT_MEMORY_ONLY_FLAGS))
    # Which predictions the adaptive strategy verifies by measurement: "could_win", those whose
    # interval could beat the best confirmed answer (the others are settled as predicted or
    # dominated, unlaunched); "all", every point of a class whose law is known, dominated or not,
    # a check of the speed-class assumption on this engine that pays every point's start-up and
    # two or three steps (and a full search wherever a verification disagrees).
    verify_predictions: Literal["could_win", "all"] = "could_win"
    # Measure the recommended point's safe concurrency once more on a freshly started server
    # (planner.sweep.fresh); the results say whether it held.
    confirm_fresh_server: bool = True
    # Search every searched point on this many starts of its server, pooling their steps: the
    # search on each later start goes on from the earlier starts' steps, and its answer must pass
    # again on that start (planner.sweep.point). An engine's speed can differ between starts (the
    # CPU demo's 32M point answered 56, 45 and 46 on three), which no step on one start can see.
    # With 2 or more, each start's own knee is fitted over its own steps, and the answer is the
    # load that held on more than half of the starts (on two, on both), at the cost of a start-up
    # and a few steps per extra start. Predicted, verified and dominated points run on one start.
    server_starts: int = Field(default=1, ge=1, le=5)
    # Up to this many more starts while the starts' own knees lie more than one precision step
    # apart ([replay] precision): each searches on its own steps from the highest of the earlier
    # knees down, and the majority settles the answer. With server_starts = 2, one more start
    # turns "what held on both" into "what held on two of three", so one start whose engine ran
    # slower no longer sets the answer alone; the report names it with its own knee.
    tie_break_starts: int = Field(default=0, ge=0, le=4)

    @field_validator("memory_only_flags")
    @classmethod
    def _flag_names(cls, flags: list[str]) -> list[str]:
        out = []
        for flag in flags:
            key = config_key(flag)
            if not re.fullmatch(r"[a-z][a-z0-9_]*", key):
                raise ValueError(f"{flag!r} is not a vLLM flag name (write it as max_num_seqs or --max-num-seqs)")
            if key in ("tensor_parallel_size", "pipeline_parallel_size", "nnodes"):
                raise ValueError(f"{key} decides how many GPUs run a step, so it changes a step's speed; it cannot be memory-only")
            out.append(key)
        return out

    @model_validator(mode="after")
    def _tie_break_needs_starts(self) -> StrategySection:
        if self.tie_break_starts and self.server_starts < 2:
            raise ValueError(
                f"tie_break_starts = {self.tie_break_starts} settles a disagreement between server starts, and"
                f" server_starts = {self.server_starts} gives only one; set server_starts = 2 (or more), or"
                " tie_break_starts = 0"
            )
        return self


class CostSection(_Strict):
    # Dollars per GPU-hour by GPU type ("H100" matches "NVIDIA H100 80GB HBM3"; planner.cost).
    # No built-in prices: they change weekly.
    gpu_hour: dict[str, float] = Field(default_factory=dict)

    @field_validator("gpu_hour")
    @classmethod
    def _positive_prices(cls, table: dict[str, float]) -> dict[str, float]:
        for kind, price in table.items():
            if not price > 0 or price == float("inf"):
                raise ValueError(f"gpu_hour {kind!r}: {price:g} is not a price; give a positive number of dollars per GPU-hour")
        return table


class SweepSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    # How to start vLLM for every point.
    server: ServerSection
    # The grid: every combination of the axes' values is one point.
    grid: GridSection = Field(default_factory=GridSection)
    # How each point is replayed and searched: planner replay's settings.
    replay: ReplaySettings = Field(default_factory=ReplaySettings)
    # The SLO bounds every step is judged against, and the headroom kept below the highest pass.
    slo: SloSection = Field(default_factory=lambda: SloSection(**slo_mod.DEFAULT_SLO))
    # Which GPUs of this machine the points may use.
    gpus: GpusSection = Field(default_factory=GpusSection)
    # The pre-flight memory estimate (planner estimate) of every point.
    estimate: EstimateSection = Field(default_factory=EstimateSection)
    # Where points run: this machine or a Ray cluster.
    executor: ExecutorSection = Field(default_factory=ExecutorSection)
    # CPU pinning for CPU servers (vLLM's CPU build).
    cpus: CpusSection = Field(default_factory=CpusSection)
    # How the grid is searched: every point in full, or adaptively ([sweep] strategy); and the
    # fresh-server confirmation of the recommended point ([sweep] confirm_fresh_server).
    sweep: StrategySection = Field(default_factory=StrategySection)
    # What a GPU hour costs, by GPU type ([cost] gpu_hour): the report's and the table's prices.
    cost: CostSection = Field(default_factory=CostSection)
    # The prompt corpus (JSONL). Paths starting with ./ or ../ are relative to the config file, others
    # to the working directory.
    prompts: str = "prompts/prod.jsonl"

    @field_validator("replay")
    @classmethod
    def _searched_not_planned(cls, replay: ReplaySettings) -> ReplaySettings:
        planned = [k for k in ("concurrency", "rate") if getattr(replay, k)] + (["trace"] if replay.trace else [])
        if replay.find_max:
            planned.append("find_max")
        if planned:
            raise ValueError(
                f"[replay] {', '.join(planned)}: a sweep searches every point itself (start_concurrency,"
                " max_concurrency, precision); remove these keys"
            )
        return replay

    @model_validator(mode="after")
    def _no_ray_backend_on_ray(self) -> SweepSettings:
        if self.executor.kind != "ray":
            return self
        where = ["[server] args"] if fixed_flags(self.server.args).get("distributed_executor_backend") == "ray" else []
        where += [
            f"[grid.extra] {k}" for k, values in self.grid.extra.items()
            if config_key(k) == "distributed_executor_backend" and "ray" in values
        ]
        if where:
            raise ValueError(
                f"[executor] kind = \"ray\" and --distributed-executor-backend ray ({', '.join(where)}): vLLM's Ray backend places its"
                " workers with a placement group of its own, on GPUs this sweep's placement groups already hold, and"
                " would wait for them; for a point across nodes use vLLM's multi-node mode ([grid.extra] nnodes = [N]),"
                " and on one node leave the backend at its default"
            )
        return self

    @field_validator("prompts")
    @classmethod
    def _prompts_relative_to_file(cls, prompts: str) -> str:
        return _relative_to_config(prompts)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: CLI flags (init), then PLANNER_* variables, then the TOML file.
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _toml_path.get()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def _valid_keys(loc: tuple) -> list[str]:
    model: Any = SweepSettings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return sorted(model.model_fields)


def _line_of(text: str, loc: tuple) -> int | None:
    """The line of `key` inside its [table] in the TOML text (None when not found there)."""
    if not loc:
        return None
    *tables, key = [str(p) for p in loc]
    current: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.match(r"^\[+\s*([^\]]+?)\s*\]+", stripped)
        if header:
            current = [p.strip().strip('"') for p in header.group(1).split(".")]
            if current == [*tables, key]:
                return number
            continue
        m = re.match(r"^([A-Za-z0-9_\-\"']+)\s*=", stripped)
        if m and m.group(1).strip("\"'") == key and current == tables:
            return number
    return None


def _explain(exc: ValidationError, path: Path | None, text: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        dotted = ".".join(str(p) for p in loc)
        line = _line_of(text, loc) if path is not None else None
        where = f"{path}:{line}: " if line else (f"{path}: " if path is not None else "")
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(loc)
            table = ".".join(str(p) for p in loc[:-1]) or "(top level)"
            msg = f"unknown key {dotted!r} in [{table}]" + (f"; valid keys: {', '.join(valid)}" if valid else "")
        elif err["type"] == "missing":
            msg = f"{dotted} is required"
        else:
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
            msg = f"{dotted}: {err['msg'].removeprefix('Value error, ')}{shown}"
        lines.append(where + msg)
    return "invalid sweep settings:\n  " + "\n  ".join(lines)


def load_settings(path: Path | None, overrides: dict[str, Any] | None = None) -> SweepSettings:
    """Read the file, apply PLANNER_* variables and `overrides` (CLI flags), validate strictly."""
    text = ""
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            tomllib.loads(text)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    token = _toml_path.set(path)
    try:
        settings = SweepSettings(**(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(_explain(exc, path, text)) from None
    finally:
        _toml_path.reset(token)
    return settings


def public_settings(settings: SweepSettings) -> dict[str, Any]:
    """The settings as saved in sweep.json: secrets removed."""
    data = settings.model_dump(mode="json")
    key = settings.server.api_key
    if key is not None:
        data["server"]["api_key"] = REDACTED
    data["server"]["args"] = redact(data["server"]["args"], [key.get_secret_value()] if key else [])
    data["server"]["env"] = redact_env(data["server"]["env"])
    return data
