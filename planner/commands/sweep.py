"""`planner sweep`: start vLLM across a grid and find the highest safe concurrency per GPU."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from planner import cost
from planner import cpus as cpus_mod
from planner import gpu_health
from planner import gpus as gpu_mod
from planner import interrupt, quiet
from planner.cliargs import add_metrics_args, env_default, key_values, metrics_exporter
from planner.commands.compare import add_baseline_args, against_baseline, check_baseline
from planner.errors import ConfigError
from planner.progress import StepProgress
from planner.report import write_report
from planner.report.html import HTML_FILE
from planner.sweep.config import load_settings
from planner.sweep.dry_run import class_lines
from planner.sweep.duration import earlier_durations, expected, mean_request_tokens
from planner.sweep.grid import expand
from planner.sweep.point import log_path, point_server
from planner.sweep.predict import predictor
from planner.sweep.results import RESULTS_FILE
from planner.sweep.run import run_sweep
from planner.tables import stdout_console, sweep_summary, sweep_table
from replay.corpus.jsonl import load_corpus


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="launch vLLM across a grid and find the highest safe concurrency per GPU",
        description=(
            "Start vLLM once per grid point, read its KV-cache capacity, replay the corpus to find the highest"
            " concurrency that meets the SLOs, and recommend the configuration with the most safe concurrency per GPU."
            " Settings come from the TOML file, then PLANNER_* variables (PLANNER_SERVER__MODEL, PLANNER_SLO__HEADROOM,"
            " ...), then these flags."
        ),
    )
    p.add_argument(
        "--config", type=Path, default=None,
        help="sweep settings (TOML); see examples/. Without it, a sweep from flags: --model, --grid, --slo, --prompts",
    )  # fmt: skip
    p.add_argument("--output", type=Path, default=Path("results/sweep"), help="results folder (default results/sweep)")
    p.add_argument("--resume", action="store_true", help="reuse finished points whose fingerprint is unchanged")
    p.add_argument(
        "--restart", action="store_true",
        help="start over in a folder that holds results: its sweep.json is moved aside (renamed, not deleted;"
        " a sweep without --resume does the same)",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the expanded grid, each command and its expected duration; start nothing")
    p.add_argument(
        "--request-duration-s", type=float, default=None,
        help="with --dry-run: seconds a corpus request takes at full load on the target GPU, to size each point",
    )
    p.add_argument("--prompts", default=None, help="corpus JSONL (overrides `prompts` in the file)")
    p.add_argument("--model", default=None, help="Hub name (org/name[@revision]) or model folder (overrides [server] model)")
    p.add_argument(
        "--grid", action="append", default=[], type=key_values("--grid", many=True), metavar="KEY=V[,V...]",
        help="a grid axis, any vLLM flag in underscore form: max_model_len=8192,32768 (repeatable; overrides that axis of [grid])",
    )  # fmt: skip
    p.add_argument(
        "--slo", action="append", default=[], type=key_values("--slo", many=False), metavar="KEY=VALUE",
        help="an SLO bound, as in [slo]: ttft_p99_ms=800, tpot_p99_ms=50 (repeatable; overrides that key)",
    )  # fmt: skip
    p.add_argument("--gpu", default=None, help="GPU for the estimate when nvidia-smi cannot tell, e.g. H100 (overrides [estimate] gpu)")
    p.add_argument("--headroom", type=float, default=None, help="fraction of max passing concurrency kept free (overrides [slo] headroom)")
    p.add_argument("--no-prune", action="store_true", help="launch points the estimate predicts cannot fit")
    p.add_argument("--target-rps", type=float, default=env_default("PLANNER_TARGET_RPS"),
                   help="size a fleet for this many requests/s in the report (env PLANNER_TARGET_RPS)")
    p.add_argument("--target-concurrency", type=int, default=env_default("PLANNER_TARGET_CONCURRENCY"),
                   help="size a fleet for this many concurrent requests in the report (env PLANNER_TARGET_CONCURRENCY)")
    p.add_argument("--gpu-hour-price", action="append", default=[], metavar="PRICE|TYPE=PRICE",
                   help="dollars per GPU-hour for the table's and the report's cost: PRICE for every GPU or TYPE=PRICE,"
                   " repeatable (over [cost] gpu_hour)")
    p.add_argument("--executor", choices=("local", "ray"), default=None,
                   help="where points run: this machine or a Ray cluster (overrides [executor] kind; env PLANNER_EXECUTOR__KIND)")
    p.add_argument(
        "--allow-interference", action="store_true",
        help="record what else ran during each step but never call a step disturbed (overrides [replay] allow_interference)",
    )
    p.add_argument("--require-quiet", action="store_true", help="stop before the first server starts when the machine is busy")
    add_baseline_args(p)
    add_metrics_args(p)
    p.set_defaults(run=run)


# [grid]'s own axes; any other flag is an axis of [grid.extra].
GRID_AXES = ("max_model_len", "gpu_memory_utilization", "tensor_parallel_size")


def overrides_from_args(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.prompts is not None:
        out["prompts"] = args.prompts
    if args.model is not None:
        out["server"] = {"model": args.model}
    slo = dict(args.slo)
    if args.headroom is not None:
        slo["headroom"] = args.headroom
    if slo:
        out["slo"] = slo
    grid: dict = {}
    for key, values in args.grid:
        if key in GRID_AXES:
            grid[key] = values
        else:
            grid.setdefault("extra", {})[key] = values
    if grid:
        out["grid"] = grid
    estimate = {}
    if args.no_prune:
        estimate["prune"] = False
    if args.gpu is not None:
        estimate["gpu"] = args.gpu
    if estimate:
        out["estimate"] = estimate
    if args.executor is not None:
        out["executor"] = {"kind": args.executor}
    if args.allow_interference:
        out["replay"] = {"allow_interference": True}
    return out


def run(args: argparse.Namespace) -> int:
    if args.config is None and args.model is None and not os.environ.get("PLANNER_SERVER__MODEL"):
        raise ConfigError("give --config FILE (see examples/), or --model for a sweep from flags (with --grid, --slo and --prompts)")
    settings = load_settings(args.config, overrides_from_args(args))
    # A mistyped price must not wait for the end of the sweep to be found.
    cost.parse_flag_prices(args.gpu_hour_price)
    console = stdout_console()
    points = expand(settings)
    if args.dry_run:
        console.print(f"{len(points)} points; server command: {shlex.join(settings.server.command)}")
        earlier = earlier_durations(args.output)
        predict = predictor(settings)
        window = settings.replay.window(settings.slo.rules())
        mean_tokens = None
        # Each point's estimate, kept for the classes' block below (planner.sweep.dry_run).
        predictions: dict = {}
        expected_by_point: dict = {}
        if args.request_duration_s is not None:
            mean_tokens = mean_request_tokens(load_corpus(settings.prompts).requests, settings.replay.max_tokens or 16)
        for point in points:
            env = " ".join(f"{k}={v}" for k, v in point.env.items())
            # The same command the sweep will run (its GPUs and CPUs are chosen only then).
            server = point_server(
                settings, point, log_path=args.output / log_path(point.id), gpu_ids=(), port=settings.server.port or None
            )
            console.print(
                f"{point.id}: {(env + ' ') if env else ''}{shlex.join(server.command_for_record)}",
                soft_wrap=True,
                highlight=False,
            )
            expected_by_point[point.id] = expected(
                point,
                earlier=earlier,
                request_duration_s=args.request_duration_s,
                prediction=predictions.setdefault(point.id, predict(point, [])) if args.request_duration_s is not None else None,
                mean_request_tokens=mean_tokens,
                min_requests=window.min_requests,
                confirm=settings.replay.confirm_knee,
            )
            console.print(f"  {expected_by_point[point.id].text}", soft_wrap=True, highlight=False)
        for line in class_lines(settings, points, predictions, mean_tokens, expected_by_point):
            console.print(line, soft_wrap=True, highlight=False, markup=False)
        return 0
    if args.resume and args.restart:
        raise ConfigError("--resume and --restart contradict each other: --resume continues the folder's sweep.json, --restart moves it aside and starts over")
    check_baseline(args)
    corpus = load_corpus(settings.prompts)
    pinned = cpus_mod.split(settings.cpus.client)
    if pinned is not None:
        # Before any thread starts: threads inherit the mask of the one that starts them.
        cpus_mod.pin_self(pinned)
    if settings.executor.kind == "local":
        # No server runs yet: every other process on these CPUs and GPUs is someone else's.
        foreign = gpu_health.foreign_now(gpu_mod.discover(settings.gpus.devices))
        check = quiet.check_machine(
            set(), server_cpus=pinned.server if pinned else None, planner_cpus=pinned.client if pinned else None,
            foreign_gpu=foreign,
        )
        console.print(quiet.enforce(check, args.require_quiet), soft_wrap=True, highlight=False)
    with metrics_exporter(args) as exporter, StepProgress(settings.replay.window(settings.slo.rules()).min_requests) as progress:
        results = interrupt.run(
            run_sweep(
                settings,
                corpus,
                output_dir=args.output,
                resume=args.resume,
                restart=args.restart,
                observers=[o for o in (progress, exporter) if o is not None],
                predict=predictor(settings),
                cpus=pinned,
            )
        )
    written = write_report(args.output, target_rps=args.target_rps, target_concurrency=args.target_concurrency,
                           gpu_hour_price=args.gpu_hour_price)
    console.print(sweep_table(results, args.gpu_hour_price))
    for line in sweep_summary(results):
        console.print(line, soft_wrap=True, highlight=False)
    console.print(f"results: {args.output / RESULTS_FILE}; report: {written[0]}, {written[0].with_name(HTML_FILE)}")
    return against_baseline(args, args.output, console)

