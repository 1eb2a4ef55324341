"""vLLM's command-line arguments as the planner reads them.

vLLM takes `--flag VALUE`, `--flag=VALUE` and bare boolean flags (`--enforce-eager`). These are
the only places the planner scans an argument list; everything else passes it through unread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planner.errors import LaunchError


def has_flag(args: Sequence[str], *names: str) -> bool:
    """Whether any of `names` is given, as `--name`, `--name VALUE` or `--name=VALUE`."""
    return any(a in names or a.startswith(tuple(n + "=" for n in names)) for a in args)


def flag_int(args: Sequence[str], flag: str) -> int | None:
    """The first value given to `flag`, as an integer; None when absent or not an integer."""
    for i, token in enumerate(args):
        value = None
        if token == flag and i + 1 < len(args):
            value = args[i + 1]
        elif token.startswith(flag + "="):
            value = token.removeprefix(flag + "=")
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def config_key(flag: str) -> str:
    """A flag in the underscore form the config and results use: `--max-num-seqs` -> max_num_seqs."""
    return flag.strip("-").replace("-", "_")


def fixed_flags(args: Sequence[str]) -> dict[str, Any]:
    """`[server] args` as underscore-form flags: `--max-num-seqs 8` -> {"max_num_seqs": "8"},
    a bare `--enforce-eager` -> {"enforce_eager": True}."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            key = config_key(name)
            if eq:
                flags[key] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[key] = args[i + 1]
                i += 1
            else:
                flags[key] = True
        i += 1
    return flags


def take_api_key(args: Sequence[str]) -> tuple[list[str], str | None]:
    """args without `--api-key X` / `--api-key=X`, and X: vLLM logs its command-line arguments
    ("non-default args: {...}") but not the VLLM_API_KEY variable, so the key goes there."""
    kept: list[str] = []
    key: str | None = None
    tokens = iter(args)
    for token in tokens:
        if token == "--api-key":
            key = next(tokens, None)
            if key is None:
                raise LaunchError("server argument --api-key has no value; give it as --api-key KEY")
        elif token.startswith("--api-key="):
            key = token.removeprefix("--api-key=")
        else:
            kept.append(token)
    return kept, key
