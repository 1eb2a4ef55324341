"""Settings models built from plain values, a ValidationError becoming one readable ConfigError.

The commands build their settings from flags and the estimate from a sweep point's flags; both
report a bad value the same way: `source: field: problem (got value)`.
"""

from __future__ import annotations

from pydantic import ValidationError

from planner.errors import ConfigError


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
