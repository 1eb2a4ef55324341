"""Argument types and the conversion of validation errors into one readable usage error."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from pydantic import ValidationError

from planner.errors import ConfigError


def comma_list(kind: Callable[[str], object], what: str) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None

    return parse


def env_default(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def validation_message(exc: ValidationError, *, source: str) -> str:
    """`source: field: problem (got value)` for each error, on one line each."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(settings)"
        got = err.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        parts.append(f"{source}: {loc}: {err['msg']}{shown}")
    return "; ".join(parts)


def build(model_cls, data: dict, *, source: str):
    try:
        return model_cls(**data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, source=source)) from None
