"""Argument types and shared options for the commands' parsers."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.exporter import PlannerMetrics


def comma_list(kind: Callable[[str], object], what: str) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None

    return parse


def positive_int(flag: str) -> Callable[[str], int]:
    """An integer >= 1 for `flag`; anything else is one usage error naming the flag and the text."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: must be a positive integer")
        return value

    return parse


def whole_number(least: int, of: str, at_least: str) -> Callable[[str], int]:
    """An integer >= `least`: "'x' is not a whole number of {of}", or "'-1' must be >= {at_least}"."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {of}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {at_least}")
        return value

    return parse


def scalar(text: str) -> int | float | bool | str:
    """A flag's value as TOML would type it: 8192 -> int, 0.9 -> float, true -> bool, else the text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def key_values(flag: str, *, many: bool) -> Callable[[str], tuple[str, object]]:
    """`KEY=V` (or `KEY=V,V,...` when many) -> (KEY, value or [values])."""

    def parse(text: str) -> tuple[str, object]:
        key, sep, value = text.partition("=")
        values = [scalar(v) for v in value.split(",") if v.strip()] if many else [scalar(value)] if value.strip() else []
        if not sep or not key.strip() or not values:
            shape = "KEY=VALUE[,VALUE...]" if many else "KEY=VALUE"
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected {shape}")
        return key.strip().replace("-", "_"), values if many else values[0]

    return parse


def flag_values(args: argparse.Namespace, *names: str, **others: object) -> dict[str, object]:
    """The keyword arguments of settings built from a command's flags: each flag of `names` (its
    dest, which is the field's name) with its value, then `others` for fields named otherwise."""
    return {name: getattr(args, name) for name in names} | others


def env_default(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def add_metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=None, help="serve the planner's Prometheus metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics server (default 127.0.0.1)")


@contextlib.contextmanager
def metrics_exporter(args: argparse.Namespace) -> Iterator[PlannerMetrics | None]:
    """The planner's metrics, served on --metrics-host:--metrics-port while the block runs; None
    without --metrics-port."""
    if args.metrics_port is None:
        yield None
        return
    # Imported here: a command run without --metrics-port never needs the Prometheus client.
    from planner.exporter import PlannerMetrics

    exporter = PlannerMetrics()
    exporter.start(host=args.metrics_host, port=args.metrics_port)
    with exporter:
        yield exporter
