"""`planner report`: rebuild report.md, summary.csv and the plots from saved results; no server needed."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from planner.cliargs import env_default, whole_number


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of requests per second") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive, finite number of requests per second")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="rebuild the report (markdown and HTML), CSV and plots from sweep.json or replay.json",
        description=(
            "Rebuild report.md, report.html, summary.csv and PNG plots from DIR/sweep.json or DIR/replay.json alone. "
            "With a target load, also size the fleet for every feasible point."
        ),
    )
    p.add_argument(
        "results",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="a folder holding sweep.json or replay.json; with several (sweeps on different machines) and a"
        " target, rank every measured point by the fleet's cost instead",
    )
    p.add_argument(
        "--target-rps",
        type=_positive_float,
        default=env_default("PLANNER_TARGET_RPS"),
        metavar="R",
        help="size the fleet for R requests/s (env PLANNER_TARGET_RPS)",
    )
    p.add_argument(
        "--target-concurrency",
        type=whole_number(1, "concurrent requests", "1 concurrent request"),
        default=env_default("PLANNER_TARGET_CONCURRENCY"),
        metavar="C",
        help="size the fleet for C concurrent requests (env PLANNER_TARGET_CONCURRENCY)",
    )
    p.add_argument(
        "--gpu-hour-price",
        action="append",
        default=[],
        metavar="PRICE|TYPE=PRICE",
        help="dollars per GPU-hour: PRICE for every GPU, or TYPE=PRICE for one GPU type (H100=2.49), repeatable;"
        " over the sweep config's [cost] gpu_hour. No prices are built in",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from planner.report import rank_sweeps, write_report

    if len(args.results) > 1:
        text = rank_sweeps(
            args.results,
            target_rps=args.target_rps,
            target_concurrency=args.target_concurrency,
            gpu_hour_price=args.gpu_hour_price,
        )
        Console(soft_wrap=True).print(text, markup=False, highlight=False, end="")
        return 0
    paths = write_report(
        args.results[0],
        target_rps=args.target_rps,
        target_concurrency=args.target_concurrency,
        gpu_hour_price=args.gpu_hour_price,
    )
    console = Console()
    for path in paths:
        console.print(str(path), highlight=False, soft_wrap=True)
    return 0
