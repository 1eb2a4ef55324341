"""The command line: parse, build validated settings, call one entry point per command.

One module per command under planner/commands; each has `register(subparsers)` which adds its
parser and sets `run(args) -> int`. Domain errors become one line on stderr and exit code 2;
`--debug` (or PLANNER_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from planner import __version__
from planner.errors import PlannerError
from planner.interrupt import EXIT_STATUS as SIGTERM_EXIT_STATUS
from planner.interrupt import Terminated
from replay.errors import ReplayError

# planner.commands.NAME for each; `planner --help` lists them in this order.
COMMANDS: tuple[str, ...] = (
    "init", "replay", "report", "compare", "sweep", "prompts", "estimate", "measure_train", "export",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="planner",
        description="vLLM serving capacity planner: the highest concurrency per GPU that meets your SLOs.",
    )
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks (env PLANNER_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"planner.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("PLANNER_DEBUG") == "1"
    try:
        return int(args.run(args) or 0)
    except (PlannerError, ReplayError) as exc:
        if debug:
            raise
        print(f"planner {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"planner {args.command}: interrupted; results measured so far are kept", file=sys.stderr)
        return 130
    except Terminated:
        print(f"planner {args.command}: terminated (SIGTERM); results measured so far are kept", file=sys.stderr)
        return SIGTERM_EXIT_STATUS
