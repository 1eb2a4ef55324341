"""Keeping secrets out of what the planner writes: results, logs, printed commands.

A secret is the API key (given in [server] api_key or as `--api-key` in the server's arguments),
any `NAME=VALUE` argument whose name looks like a credential, and any [server] env variable whose
name does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "***"

_SECRET_ASSIGNMENT = re.compile(r"(?i)^(.*(?:api[_-]?key|token|secret|password)[^=]*=)(.+)$")
_SECRET_ENV_NAME = re.compile(r"(?i)(key|token|secret|password)")


def redact(command: Sequence[str], secrets: Sequence[str] = ()) -> list[str]:
    """The command with `--api-key VALUE`, `NAME_KEY=VALUE`-style tokens and every secret masked."""
    redacted: list[str] = []
    hide_next = False
    for token in command:
        if hide_next:
            redacted.append(REDACTED)
            hide_next = False
            continue
        if token == "--api-key":
            hide_next = True
            redacted.append(token)
            continue
        if token.startswith("--api-key="):
            token = "--api-key=" + REDACTED
        elif match := _SECRET_ASSIGNMENT.match(token):
            token = match.group(1) + REDACTED
        for secret in secrets:
            if secret:
                token = token.replace(secret, REDACTED)
        redacted.append(token)
    return redacted


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables with the value of every credential-like name masked."""
    return {k: (REDACTED if _SECRET_ENV_NAME.search(k) else v) for k, v in env.items()}
