"""What every export is made of: one measured point, each of its numbers with where it came from,
and the header every output starts with.

`load_point(results, point_id=None, server_command=None)` reads sweep.json (the recommended point
unless another is named) or a replay's replay.json plus the server command it was measured
against, and returns a `MeasuredPoint`. Its numbers are `Figure`s: a value and the sentence that
says which field of which file it was read from (or what it was computed from), so that each
output can print that sentence beside the number it uses.

Secrets never leave the results file (the planner saves them as "***"); an export turns each into
a reference the platform fills in: an environment variable, a Kubernetes Secret.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from planner import __version__
from planner.errors import ReportError
from planner.redaction import REDACTED
from planner.report.load import load_results
from planner.sweep.results import PointResult, SweepResults
from planner.vllm_args import flag_int
from replay.slo import rules as slo_mod
from replay.errors import SloSpecError
from replay.results import ReplayResults
from replay.search.pass_fit import level_of, majority_knee
from replay.search.verdicts import recommended_load

# Where the container serves; the sweep's own host and port were this machine's.
SERVE_PORT = 8000
# vLLM reads its API key from this variable (the sweep passes it so too).
API_KEY_ENV = "VLLM_API_KEY"
# Flags the export sets itself: where the server listens.
_LISTEN_FLAGS = ("--host", "--port")


@dataclass(frozen=True)
class Figure:
    """A number an output uses, and where it came from."""

    value: float | int | str
    source: str

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Options:
    """What the results cannot say: where the objects go and how far they may scale. Each default
    is named as a default, never as a measurement, in the outputs that use it."""

    namespace: str = "default"
    # Where KEDA queries Prometheus: the production-stack chart's default address.
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    min_replicas: int = 1
    max_replicas: int = 10
    # PromQL range of the SLO and preemption alerts, and how long a breach lasts before it fires.
    alert_window: str = "5m"
    alert_for: str = "5m"
    # The start-up probe allows this many times the measured start-up: a new node may read the
    # weights from a colder disk or cache than the sweep's.
    startup_margin: float = 2.0


@dataclass(frozen=True)
class MeasuredPoint:
    results_path: Path
    point_id: str
    measured_at: str | None
    # The program and its arguments as the sweep ran them, without --host/--port and with every
    # secret value still "***".
    program: tuple[str, ...]
    model: str
    revision: str | None
    served_model_name: str
    # The flags after the model (and revision), in the order the sweep gave them.
    flags: tuple[str, ...]
    env: dict[str, str]
    # Names of variables that carry a secret (their value is a reference, never a value).
    secret_env: tuple[str, ...]
    vllm_version: str | None
    gpus: Figure
    gpu_model: str | None
    safe_concurrency: Figure
    max_passing: Figure
    headroom: Figure
    slo: dict[str, Figure]
    startup_s: Figure | None
    # False when startup_s is the configured ceiling (startup_timeout_s), not a measurement.
    startup_measured: bool
    gpu_memory_peak_mib: Figure | None
    output_tokens_per_s_per_gpu: Figure | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def app_name(self) -> str:
        """A DNS-1123 name for the objects: the served model's last path part, lower-cased."""
        base = self.served_model_name.rstrip("/").rsplit("/", 1)[-1].lower()
        cleaned = "".join(c if c.isalnum() else "-" for c in base).strip("-")
        return ("vllm-" + cleaned)[:52].rstrip("-") or "vllm"

    def startup_allowance_s(self, options: Options) -> float | None:
        """How long a probe waits for /health: the measured start-up times the margin, or the
        sweep's own ceiling as it is when the start-up was not recorded."""
        if self.startup_s is None:
            return None
        seconds = float(self.startup_s.value)
        return seconds * options.startup_margin if self.startup_measured else seconds

    def startup_text(self, options: Options) -> str:
        if self.startup_s is None:
            return "the start-up was not measured"
        if self.startup_measured:
            return f"{options.startup_margin:g} x the measured start-up {self.startup_s} s ({self.startup_s.source})"
        return f"the sweep's start-up ceiling {self.startup_s} s ({self.startup_s.source})"

    def server_args(self) -> list[str]:
        """The arguments after the program: --model, --revision, the point's flags, then where it
        listens. A secret flag's value (--api-key) is dropped: the key travels in VLLM_API_KEY."""
        args = ["--model", self.model]
        if self.revision:
            args += ["--revision", self.revision]
        return [*args, *self.flags, "--host", "0.0.0.0", "--port", str(SERVE_PORT)]

    def image(self) -> Figure:
        if not self.vllm_version:
            raise ReportError(
                f"{self.results_path}: the vLLM version of point {self.point_id} is not recorded, so the"
                " container image cannot be named; re-run the point with this planner"
            )
        version = self.vllm_version.split("+")[0]
        return Figure(f"vllm/vllm-openai:v{version}", f"the vLLM version the point ran ({self.vllm_version})")


def header_lines(point: MeasuredPoint, what: str) -> list[str]:
    """The header every output starts with (without a comment marker)."""
    lines = [
        f"{what}, exported by planner {__version__} on {datetime.now(UTC).date().isoformat()}",
        f"from {point.results_path}, point {point.point_id}, measured {point.measured_at or 'at an unrecorded time'}",
        f"model {point.model}" + (f" at revision {point.revision}" if point.revision else " (revision not recorded)"),
        f"safe concurrency {point.safe_concurrency}: {point.safe_concurrency.source}",
    ]
    return lines + list(point.notes)


def commented(lines: list[str], marker: str = "#") -> str:
    return "\n".join(f"{marker} {line}".rstrip() for line in lines) + "\n"


def load_point(results: Path, *, point_id: str | None = None, server_command: str | None = None) -> MeasuredPoint:
    source, parsed = load_results(Path(results))
    if isinstance(parsed, SweepResults):
        if server_command is not None:
            raise ReportError(f"{source}: --server-command is for a replay's results; a sweep records each point's command")
        return _from_sweep(source, parsed, point_id)
    return _from_replay(source, parsed, point_id, server_command)


def _pick(source: Path, results: SweepResults, point_id: str | None) -> PointResult:
    usable = [p for p in results.points if p.status == "ok" and p.safe_concurrency]
    if point_id is None:
        if results.best is None:
            raise ReportError(f"{source}: the sweep recommends no point (none met the SLOs); name one with --point")
        point_id = results.best.point_id
    for p in results.points:
        if p.id == point_id:
            if p not in usable:
                raise ReportError(
                    f"{source}: point {point_id} has status {p.status} and no safe concurrency; only a measured"
                    f" point can be deployed; measured points: {', '.join(q.id for q in usable) or 'none'}"
                )
            return p
    raise ReportError(f"{source}: no point {point_id!r}; measured points: {', '.join(q.id for q in usable) or 'none'}")


def _from_sweep(source: Path, results: SweepResults, point_id: str | None) -> MeasuredPoint:
    p = _pick(source, results, point_id)
    if len(p.ranks) > 1:
        raise ReportError(
            f"{source}: point {p.id} ran across {len(p.ranks)} nodes; these exports describe one-node replicas"
            " (one Deployment pod), and a multi-node replica needs a LeaderWorkerSet or a Ray cluster; export a"
            " one-node point with --point"
        )
    where = f"{source.name} points[{p.id}]"
    headroom = results.settings.slo.headroom if results.settings.slo.headroom is not None else 0.0
    if p.answer_basis == "start_majority" and p.start_knees:
        knees = ", ".join(f"start {k}: {'-' if v is None else v}" for k, v in p.start_knees.items())
        read_at = f"the knee that held on most server starts {majority_knee(list(p.start_knees.values()))} ({knees})"
    elif p.answer_basis == "knee_fit":
        read_at = f"knee_fit {p.knee_fit} (pass probability >= {level_of(p.knee_fit_level):g} over every step)"
    else:
        read_at = f"max passing {p.max_passing_concurrency}"
    safe = Figure(p.safe_concurrency, f"{where}.safe_concurrency = floor({read_at} x (1 - headroom {headroom:g}))")
    env = dict(getattr(results.settings.server, "env", None) or {})
    env.update({k: str(v) for k, v in (p.config.get("env") or {}).items()})
    command = p.command or (results.identity.server_command if results.identity else None) or []
    program, model, revision, flags = _split_command(source, p.id, command)
    api_key_used = getattr(results.settings.server, "api_key", None) is not None or _api_key_in(command)
    return _point(
        source=source,
        point_id=p.id,
        measured_at=p.started_at,
        program=program,
        model=model,
        revision=revision or (results.identity.model.revision if results.identity else None),
        flags=flags,
        env=env,
        api_key_used=api_key_used,
        vllm_version=p.vllm_version or results.run.vllm_version,
        gpus=Figure(p.gpus, f"{where}.gpus"),
        gpu_model=p.gpu_model,
        safe=safe,
        max_passing=Figure(p.max_passing_concurrency or 0, f"{where}.max_passing_concurrency"),
        headroom=Figure(headroom, f"{source.name} settings.slo.headroom"),
        slo={k: Figure(v, f"{source.name} settings.slo.{k}") for k, v in results.settings.slo.bounds().items()},
        startup=_startup(source, results, p),
        peak=_peak(where, p),
        tokens=None if p.output_tokens_per_s_per_gpu is None else Figure(
            p.output_tokens_per_s_per_gpu, f"{where}.output_tokens_per_s_per_gpu"
        ),
    )


def _startup(source: Path, results: SweepResults, p: PointResult) -> Figure | None:
    if p.startup_s is not None:
        return Figure(round(p.startup_s, 1), f"{source.name} points[{p.id}].startup_s (spawn to /health answering)")
    timeout = getattr(results.settings.server, "startup_timeout_s", None)
    if isinstance(timeout, int | float):
        return Figure(
            float(timeout),
            f"{source.name} settings.server.startup_timeout_s (the point's start-up was not recorded; this"
            " planner version records points[].startup_s)",
        )
    return None


def _peak(where: str, p: PointResult) -> Figure | None:
    if not p.gpu_memory_peak_mib:
        return None
    return Figure(max(p.gpu_memory_peak_mib.values()), f"{where}.gpu_memory_peak_mib (the highest of its GPUs)")


def _from_replay(source: Path, results: ReplayResults, point_id: str | None, server_command: str | None) -> MeasuredPoint:
    if point_id is not None:
        raise ReportError(f"{source}: --point names a sweep's point; a replay has only one")
    recorded = results.identity.server_command if results.identity else None
    if server_command is None and not recorded:
        raise ReportError(
            f"{source}: a replay against a URL does not know the server's command; give it with"
            " --server-command 'vllm serve MODEL --flag value ...'"
        )
    command = shlex.split(server_command) if server_command is not None else list(recorded or [])
    answer, basis = recommended_load(results.max_passing_concurrency, results.knee_fit, bool(results.pass_probability))
    if answer is None:
        if basis == "knee_fit":
            raise ReportError(
                f"{source}: no load of the replay reached pass probability {level_of(results.knee_fit_level):g}"
                " over every step; there is nothing safe to deploy"
            )
        raise ReportError(f"{source}: the replay found no passing concurrency; there is nothing safe to deploy")
    program, model, revision, flags = _split_command(source, "replay", command)
    # A replay keeps no headroom: the highest passing concurrency is what was measured to pass.
    safe = Figure(answer, f"{source.name} {basis if basis == 'knee_fit' else 'max_passing_concurrency'} (a replay keeps no headroom)")
    return _point(
        source=source,
        point_id="replay",
        measured_at=results.started_at,
        program=program,
        model=model,
        revision=revision or (results.identity.model.revision if results.identity else None),
        flags=flags,
        env=dict(results.identity.server_env or {}) if results.identity else {},
        api_key_used=_api_key_in(command),
        vllm_version=results.identity.vllm_version if results.identity else None,
        gpus=Figure(_flag_gpus(flags), "the server command's --tensor-parallel-size x --pipeline-parallel-size"),
        gpu_model=results.identity.hardware.model if results.identity and results.identity.hardware else None,
        safe=safe,
        max_passing=Figure(results.max_passing_concurrency or answer, f"{source.name} max_passing_concurrency"),
        headroom=Figure(0.0, "a replay keeps no headroom"),
        slo={k: Figure(v, f"{source.name} slo.{k}") for k, v in results.slo.items() if _known(k)},
        startup=None,
        peak=None,
        tokens=None,
    )


def _known(key: str) -> bool:
    try:
        slo_mod.check_key(key)
    except SloSpecError:
        return False
    return True


def _flag_gpus(flags: tuple[str, ...]) -> int:
    tp = flag_int(flags, "--tensor-parallel-size") or flag_int(flags, "-tp") or 1
    pp = flag_int(flags, "--pipeline-parallel-size") or flag_int(flags, "-pp") or 1
    return tp * pp


def _split_command(source: Path, point_id: str, command: list[str]) -> tuple[tuple[str, ...], str, str | None, tuple[str, ...]]:
    """(program, model, revision, flags) of a recorded server command, without --host/--port and
    --api-key (the key is passed as VLLM_API_KEY). The program is everything before the first
    `--flag` (`vllm serve`, `python -m vllm.entrypoints.openai.api_server`), less the model that
    `vllm serve MODEL` puts there."""
    tokens = list(command)
    model: str | None = None
    serve = tokens.index("serve") if "serve" in tokens else -1
    if 0 <= serve < len(tokens) - 1 and not tokens[serve + 1].startswith("-"):
        program, model, rest = tokens[: serve + 1], tokens[serve + 1], tokens[serve + 2 :]
    else:
        cut = next((i for i, tok in enumerate(tokens) if tok.startswith("--")), len(tokens))
        program, rest = tokens[:cut], tokens[cut:]
    revision: str | None = None
    flags: list[str] = []
    i = 0
    while i < len(rest):
        name, eq, inline = rest[i].partition("=")
        if name in (*_LISTEN_FLAGS, "--model", "--revision", "--api-key"):
            value = inline if eq else (rest[i + 1] if i + 1 < len(rest) else None)
            if name == "--model":
                model = value
            elif name == "--revision":
                revision = value
            i += 1 if eq else 2
            continue
        flags.append(rest[i])
        i += 1
    if model is None:
        raise ReportError(
            f"{source}: point {point_id}: the server command names no model ({shlex.join(command) or 'empty'});"
            " expected `vllm serve MODEL ...` or `... --model MODEL ...`"
        )
    if "@" in model and revision is None and not model.startswith(("/", ".")):
        model, revision = model.rsplit("@", 1)
    return tuple(program), model, revision, tuple(flags)


def _api_key_in(command: list[str]) -> bool:
    return any(tok == "--api-key" or tok.startswith("--api-key=") for tok in command)


def _served_name(model: str, flags: tuple[str, ...]) -> str:
    for i, tok in enumerate(flags):
        if tok == "--served-model-name" and i + 1 < len(flags):
            return flags[i + 1]
        if tok.startswith("--served-model-name="):
            return tok.split("=", 1)[1]
    return model


def _point(*, source: Path, point_id: str, measured_at: str | None, program: tuple[str, ...], model: str,
           revision: str | None, flags: tuple[str, ...], env: dict[str, str], api_key_used: bool,
           vllm_version: str | None, gpus: Figure, gpu_model: str | None, safe: Figure, max_passing: Figure,
           headroom: Figure, slo: dict[str, Figure], startup: Figure | None, peak: Figure | None,
           tokens: Figure | None) -> MeasuredPoint:
    secret = sorted(k for k, v in env.items() if v == REDACTED)
    if api_key_used and API_KEY_ENV not in secret:
        secret.append(API_KEY_ENV)
    plain = {k: v for k, v in env.items() if v != REDACTED and k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    clean_flags = tuple(f for f in flags if REDACTED not in f)
    notes = []
    if len(clean_flags) != len(flags):
        notes.append("flags whose value the results file redacted are left out; pass them as references")
    if model.startswith(("/", "./", "../")):
        notes.append(f"the model is a folder on the sweep's machine: mount it at {model} in the container")
    elif not revision:
        notes.append("no model revision was recorded: pin one (--revision) so every replica serves what was measured")
    if isinstance(safe.value, int | float) and not (math.isfinite(safe.value) and safe.value > 0):
        raise ReportError(f"{source}: point {point_id} has safe concurrency {safe.value}; nothing can be deployed at it")
    return MeasuredPoint(
        results_path=source, point_id=point_id, measured_at=measured_at, program=program, model=model,
        revision=revision, served_model_name=_served_name(model, clean_flags), flags=clean_flags, env=plain,
        secret_env=tuple(secret), vllm_version=vllm_version, gpus=gpus, gpu_model=gpu_model,
        safe_concurrency=safe, max_passing=max_passing, headroom=headroom, slo=slo, startup_s=startup,
        startup_measured=startup is not None and "startup_timeout_s" not in startup.source,
        gpu_memory_peak_mib=peak, output_tokens_per_s_per_gpu=tokens, notes=tuple(notes),
    )


def write_artifacts(folder: Path, outputs: list[tuple[str, str]]) -> list[Path]:
    """Write each output to FOLDER/NAME atomically (a reader never sees half a file)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"--output {folder}: cannot create the folder ({exc.strerror})") from None
    paths = []
    for name, text in outputs:
        path = folder / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        paths.append(path)
    return paths
