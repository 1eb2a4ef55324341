"""Argument types for the commands' parsers."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable


def comma_list(kind: Callable[[str], object], what: str) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None

    return parse


def env_default(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)
