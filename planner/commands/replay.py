"""`planner replay`: replay a corpus against a running server at given loads, or find the max."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from rich.console import Console

from planner import gpus as gpu_mod
from planner import interrupt, quiet
from planner.gpu_health import GpuHealthSampler, server_gpus
from planner.cliargs import add_metrics_args, comma_list, env_default, flag_values, metrics_exporter
from planner.commands.compare import add_baseline_args, against_baseline, check_baseline
from planner.identity import replay_identity
from planner.progress import StepProgress
from planner.report import write_report
from planner.report.html import HTML_FILE
from planner.tables import replay_summary, stdout_console, steps_table
from planner.validation import build
from replay.corpus.jsonl import load_corpus
from replay.load.order import RequestOrder
from replay.run.entry import RESULTS_FILE, run_replay
from replay.run.settings import ReplaySettings
from replay.slo import rules as slo_mod
from replay.step.environment import CpuProbe, WindowProbe
from replay.step.observer import Observers


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a prompt corpus against a running OpenAI-compatible server",
        description="Replay a prompt corpus against a running OpenAI-compatible server (vLLM first) and check the SLOs.",
    )
    p.add_argument("--prompts", required=True, type=Path, help="corpus JSONL (see prompts/README.md)")
    p.add_argument("--url", default=env_default("PLANNER_URL"), help="server base URL, e.g. http://127.0.0.1:8000 (env PLANNER_URL)")
    p.add_argument("--model", default=None, help="served model name (default: the first in /v1/models)")
    p.add_argument("--api", choices=["completions", "chat"], default="completions", help="endpoint (default completions)")
    p.add_argument("--api-key", default=env_default("PLANNER_API_KEY"), help="sent as a Bearer token (env PLANNER_API_KEY)")
    load = p.add_argument_group("loads (run in this order)")
    load.add_argument(
        "--concurrency", type=comma_list(int, "integers"), default=[], metavar="N[,N...]",
        help="closed-loop: N requests in flight (session corpora: N sessions, users, in flight)",
    )
    load.add_argument(
        "--rate", type=comma_list(float, "numbers"), default=[], metavar="R[,R...]",
        help="open-loop Poisson arrivals, requests/s (session corpora: sessions/s)",
    )
    load.add_argument("--trace", action="store_true", help="replay the corpus's timestamp_s arrivals")
    load.add_argument("--speed", type=float, default=1.0, help="trace speed factor (default 1.0)")
    load.add_argument("--seed", type=int, default=0, help="seed of the Poisson schedules and think times (saved in the results)")
    load.add_argument(
        "--request-order", choices=get_args(RequestOrder), default="balanced",
        help="balanced (default): every step's requests keep the corpus's mean KV-cache holding; mixed: they hold "
        "its mix of estimated lengths; file: the corpus file's order",
    )
    load.add_argument(
        "--ramp-s", type=float, default=None,
        help="a closed loop's workers start evenly over this many seconds (default: one request duration, "
        "as the earlier step nearest in load measured it; 0: all at once)",
    )
    load.add_argument(
        "--think-time-s", type=float, default=0.0,
        help="session corpora: mean seconds a user reads before a turn whose line has no think_time_s (default 0)",
    )
    load.add_argument(
        "--think-time-distribution", choices=["fixed", "exponential"], default="exponential",
        help="how those think times are drawn around the mean (default exponential, seeded)",
    )
    load.add_argument("--find-max", action="store_true", help="search the highest concurrency that passes every SLO")
    load.add_argument(
        "--start-concurrency", type=int, default=None,
        help="first probe of the search (default: --max-concurrency, else a saturation probe's count)",
    )
    load.add_argument("--max-concurrency", type=int, default=None, help="cap of the search")
    load.add_argument(
        "--saturation-requests", type=int, default=256,
        help="requests the saturation probe sends at once to find where the search starts (default 256)",
    )
    load.add_argument(
        "--point-budget-s", type=float, default=None,
        help="most seconds the search may take; what it could not resolve by then is reported (default: no limit)",
    )
    load.add_argument("--no-confirm", dest="confirm_knee", action="store_false", help="do not re-measure the highest passing concurrency")
    win = p.add_argument_group("measurement window")
    win.add_argument("--warmup-requests", type=int, default=None, help="unmeasured requests first (default: the concurrency)")
    win.add_argument("--warmup-s", type=float, default=0.0, help="unmeasured seconds first")
    win.add_argument("--min-requests", type=int, default=None, help="measured requests per step (default: what the SLOs' percentiles need, at least 100; 368 for a p99)")
    win.add_argument("--max-requests", type=int, default=None, help="an inconclusive step measures on to this many (default 4 x min)")
    win.add_argument("--min-window-s", type=float, default=0.0, help="shortest measurement window")
    win.add_argument(
        "--max-window-s", type=float, default=None,
        help="longest measurement window (default: sized from the request duration the warm-up measured)",
    )
    win.add_argument(
        "--warmup-timeout-s", type=float, default=600.0,
        help="a warm-up not finished after this long means a stalled server (default 600)",
    )
    req = p.add_argument_group("requests")
    req.add_argument("--max-tokens", type=int, default=None, help="output length for lines without max_tokens")
    req.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="do not send ignore_eos: true")
    req.add_argument("--request-timeout-s", type=float, default=600.0, help="per-request time-out (default 600)")
    chk = p.add_argument_group("client against server (vLLM's histograms)")
    chk.add_argument(
        "--client-ttft-excess-ms", type=float, default=10.0,
        help="flag a step when the client's mean TTFT exceeds vLLM's by more than this (default 10) ...",
    )
    chk.add_argument(
        "--client-ttft-excess-fraction", type=float, default=0.10,
        help="... or by more than this fraction of vLLM's, whichever is larger (default 0.1)",
    )
    p.add_argument(
        "--slo",
        default=",".join(f"{k}={v:g}" for k, v in slo_mod.DEFAULT_SLO.items()),
        help=f"SLOs as key=value,... (default %(default)s); keys: {slo_mod.VALID_KEYS_HELP}",
    )
    env = p.add_argument_group("interference (see docs/concepts/environment.md)")
    env.add_argument(
        "--allow-interference", action="store_true",
        default=env_default("PLANNER_REPLAY__ALLOW_INTERFERENCE", "").lower() in ("1", "true", "yes"),
        help="record what else ran during each step but never call a step disturbed; the results say so"
        " (env PLANNER_REPLAY__ALLOW_INTERFERENCE)",
    )
    env.add_argument("--require-quiet", action="store_true", help="stop before the load when the machine is busy")
    p.add_argument("--skip-invalid", action="store_true", help="skip invalid corpus lines (and report how many)")
    p.add_argument("--output", type=Path, default=None, help=f"write DIR/{RESULTS_FILE} after every step, and the report")
    add_baseline_args(p)
    add_metrics_args(p)
    p.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace) -> ReplaySettings:
    return build(
        ReplaySettings,
        flag_values(
            args,
            "api", "max_tokens", "ignore_eos", "request_timeout_s",
            "concurrency", "rate", "trace", "seed", "request_order", "ramp_s", "think_time_s", "think_time_distribution",
            "warmup_requests", "warmup_s", "min_requests", "max_requests", "min_window_s", "max_window_s", "warmup_timeout_s",
            "find_max", "start_concurrency", "max_concurrency", "saturation_requests", "point_budget_s",
            "client_ttft_excess_ms", "client_ttft_excess_fraction", "confirm_knee", "allow_interference",
            trace_speed=args.speed,
        ),
        source="planner replay",
    )


def run(args: argparse.Namespace) -> int:
    from planner.errors import ConfigError

    if not args.url:
        raise ConfigError("--url is required (or set PLANNER_URL), e.g. --url http://127.0.0.1:8000")
    if args.baseline is not None and args.output is None:
        raise ConfigError(f"--baseline {args.baseline} needs --output DIR: the comparison reads the new run's {RESULTS_FILE}")
    settings = settings_from_args(args)
    slo = slo_mod.parse(args.slo)
    check_baseline(args)
    corpus = load_corpus(args.prompts, skip_invalid=args.skip_invalid)
    console = stdout_console()
    if corpus.skipped_invalid:
        Console(stderr=True).print(f"skipped {corpus.skipped_invalid} invalid corpus lines (--skip-invalid)")

    where = quiet.locate_server(args.url)
    check = quiet.check_machine(where.pids or None, remote=where.remote)
    console.print(quiet.enforce(check, args.require_quiet) + (f"; {where.note}" if where.note else ""), highlight=False)

    def probes() -> list[WindowProbe]:
        return [CpuProbe((lambda: set(where.pids)) if where.pids else None, remote=where.remote)]

    # A server on this machine: its GPUs are watched as a sweep's point's are (planner.gpu_health:
    # clocks, throttling, foreign compute processes), each step's record saying what it saw.
    monitor = None
    here = gpu_mod.discover("auto") if where.pids else []
    if here:
        gpu_ids, gpu_note = server_gpus(where.pids, here)
        monitor = lambda: GpuHealthSampler(gpu_ids, server_pids=lambda: set(where.pids))  # noqa: E731
        console.print(f"watching GPU {', '.join(gpu_ids)} during each step" + (f" ({gpu_note})" if gpu_note else ""), highlight=False)

    with metrics_exporter(args) as exporter, StepProgress(settings.window(slo).min_requests) as progress:
        results = interrupt.run(
            run_replay(
                url=args.url.rstrip("/"),
                corpus=corpus,
                settings=settings,
                slo=slo,
                model=args.model,
                api_key=args.api_key,
                output_dir=args.output,
                observer=Observers(progress, exporter),
                identity=replay_identity(args.url),
                probes=probes,
                step_monitor=monitor,
            )
        )
    console.print(steps_table(results.steps, title=f"{results.model} at {results.url}"))
    for line in replay_summary(results):
        console.print(line)
    if args.output is not None:
        written = write_report(args.output)
        console.print(f"results: {args.output / RESULTS_FILE}; report: {written[0]}, {written[0].with_name(HTML_FILE)}")
        return against_baseline(args, args.output, console)
    return 0
