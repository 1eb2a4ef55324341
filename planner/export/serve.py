"""`serve`: the exact `vllm serve` command line of the measured point, as a shell script.

The program is the one the sweep ran (`vllm serve`, the module form, a container command); the
point's flags and environment follow in the sweep's order, then where the server listens. A
secret is a reference: `${NAME:?...}` fails the script when the variable is unset, rather than
starting a server without its key.
"""

from __future__ import annotations

import shlex

from planner.export.provenance import MeasuredPoint, commented, header_lines


def render(point: MeasuredPoint) -> str:
    lines = ["#!/bin/sh", commented(header_lines(point, "The measured vLLM server's command")).rstrip()]
    for name in point.secret_env:
        lines.append(f': "${{{name}:?set {name} (a secret the results file does not keep)}}"')
    env = [f"{name}={shlex.quote(value)}" for name, value in sorted(point.env.items())]
    # exec: the server gets the shell's signals (a container's stop) directly.
    first = " ".join(["exec", *env, *map(shlex.quote, point.program)])
    lines.append(" \\\n  ".join([first, *_flag_lines(point.server_args())]))
    return "\n".join(lines) + "\n"


def _flag_lines(args: list[str]) -> list[str]:
    """One flag a line, with its values beside it."""
    out: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") or not out:
            out.append([arg])
        else:
            out[-1].append(arg)
    return [" ".join(shlex.quote(a) for a in group) for group in out]
