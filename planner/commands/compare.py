"""`planner compare BASE NEW`: what changed between two runs, whether capacity moved beyond the
noise, and an exit status a CI pipeline can gate on. Also the `--baseline` of sweep and replay."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.cliargs import env_default
from planner.report.load import results_file

# Exit status when --fail-on is met (usage and input errors are 2, as for every command).
EXIT_FAIL = 1
FAIL_ON = ("none", "regression", "change")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two runs (sweep or replay): what changed, and whether capacity moved beyond the noise",
        description=(
            "Compare a baseline run with a new one (each a results folder, or its sweep.json / replay.json):"
            " what differs in what they measured, each point's capacity from its knee interval, and every"
            " SLO-bound latency statistic and throughput per GPU at the loads both measured, with a"
            " significance test honest for correlated requests. Writes compare.md, compare.json and plots."
            " Exit status: 0, or 1 when --fail-on is met; 2 for a usage or input error."
        ),
    )
    p.add_argument("base", type=Path, metavar="BASE", help="the baseline: a results folder or its sweep.json / replay.json")
    p.add_argument("new", type=Path, metavar="NEW", help="the new run, of the same kind as BASE")
    p.add_argument(
        "--output", type=Path, default=None,
        help="folder for compare.md, compare.json and the plots (default: NEW's folder)",
    )  # fmt: skip
    add_fail_on(p)
    p.add_argument("--no-plots", dest="plots", action="store_false", help="write no PNG plots")
    p.set_defaults(run=run)


def add_fail_on(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fail-on", choices=FAIL_ON, default=env_default("PLANNER_FAIL_ON", "none"),
        help="exit 1 when a point regressed (regression) or changed significantly either way (change);"
        " default none (env PLANNER_FAIL_ON)",
    )  # fmt: skip
    p.add_argument(
        "--min-change", type=_fraction, default=env_default("PLANNER_MIN_CHANGE", "0"), metavar="FRACTION",
        help="a significant change of a figure smaller than this fraction of the baseline's counts as"
        " unchanged, e.g. 0.05 (default 0: every significant change counts; env PLANNER_MIN_CHANGE)",
    )  # fmt: skip


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a fraction such as 0.05") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction from 0 up to 1, such as 0.05")
    return value


def add_baseline_args(p: argparse.ArgumentParser) -> None:
    """`--baseline DIR` (and --fail-on) for the commands that measure."""
    p.add_argument(
        "--baseline", type=Path, default=env_default("PLANNER_BASELINE"),
        help="compare the finished run with this earlier results folder and print the summary"
        " (writes compare.md beside the results; env PLANNER_BASELINE)",
    )  # fmt: skip
    add_fail_on(p)


def check_baseline(args: argparse.Namespace) -> None:
    """Read the baseline before anything is measured: a mistyped folder must not cost a sweep."""
    _check_fail_on(args.fail_on)
    if args.baseline is not None:
        from planner.compare.runs import load_run

        load_run(Path(args.baseline))


def _check_fail_on(fail_on: str) -> None:
    # argparse checks choices on the command line only, not a default from the environment.
    if fail_on not in FAIL_ON:
        from planner.errors import ConfigError

        raise ConfigError(f"--fail-on (or PLANNER_FAIL_ON) is {fail_on!r}; valid: {', '.join(FAIL_ON)}")


def exit_status(comparison, fail_on: str) -> int:
    if fail_on == "regression" and comparison.regressed():
        return EXIT_FAIL
    if fail_on == "change" and comparison.changed():
        return EXIT_FAIL
    return 0


def compare_and_print(base: Path, new: Path, out_dir: Path, *, args: argparse.Namespace, plots: bool, console) -> int:
    from planner.compare import MARKDOWN_FILE, summary_lines, write_comparison

    comparison = write_comparison(base, new, out_dir, plots=plots, min_change=args.min_change)
    for line in summary_lines(comparison):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    console.print(f"comparison: {Path(out_dir) / MARKDOWN_FILE}", soft_wrap=True, highlight=False, markup=False)
    return exit_status(comparison, args.fail_on)


def against_baseline(args: argparse.Namespace, results_dir: Path, console) -> int:
    """After `planner sweep` or `planner replay`: compare with --baseline when given."""
    if args.baseline is None:
        return 0
    return compare_and_print(
        Path(args.baseline), results_dir, results_dir, args=args, plots=True, console=console
    )


def run(args: argparse.Namespace) -> int:
    from planner.tables import stdout_console

    _check_fail_on(args.fail_on)
    out_dir = args.output if args.output is not None else results_file(args.new).parent
    return compare_and_print(args.base, args.new, out_dir, args=args, plots=args.plots, console=stdout_console())
