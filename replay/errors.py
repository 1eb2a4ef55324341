"""Errors raised by replay. Each message says what was wrong, where, and what is valid.

    ReplayError
     +-- CorpusError          a corpus line or file is invalid (carries path and line)
     +-- SloSpecError         an SLO expression cannot be parsed
     +-- StepAborted          a step was stopped because its server went away
     +-- ServerError          the server cannot be used for a replay at all
          +-- ServerUnreachable   nothing answers at the URL
          +-- AuthError           the server rejected the API key (HTTP 401/403)
          +-- ModelNotServed      the requested model is not in /v1/models

Failures of single requests during a step are never exceptions: they are counted by kind
in the step's results.
"""

from __future__ import annotations


class ReplayError(Exception):
    """Base class of every error replay raises on purpose.

    What to do: read the one line it printed: it names what, where and what is valid."""


class CorpusError(ReplayError):
    """A corpus line or file is invalid; the message starts with FILE:LINE.

    What to do: fix that line (see the corpus format in Replaying production traffic), or pass
    --skip-invalid to skip and count bad lines."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}: " if path is not None and line is not None else (f"{path}: " if path else "")
        super().__init__(f"{where}{message}")


class SloSpecError(ReplayError):
    """An SLO key or value cannot be parsed (--slo, or a key of [slo]).

    What to do: use a key the message lists, with a number: `ttft_p99_ms=800`."""


class StepAborted(ReplayError):
    """A step was stopped because its server went away.

    What to do: read the server's log; in a sweep the point is `failed` (`server_died`) with the
    steps it finished."""


class ServerError(ReplayError):
    """The server cannot be used for a replay at all.

    What to do: see the kind below."""


class ServerUnreachable(ServerError):
    """Nothing answers at the URL.

    What to do: start the server, or correct --url (env PLANNER_URL)."""


class AuthError(ServerError):
    """The server rejected the API key (HTTP 401/403).

    What to do: pass the server's key with --api-key (env PLANNER_API_KEY; [server] api_key in a
    sweep)."""


class ModelNotServed(ServerError):
    """The requested model is not in the server's /v1/models.

    What to do: pass one of the served models the message lists with --model, or leave --model
    out to use the first."""

    def __init__(self, model: str, served: list[str]) -> None:
        self.model = model
        self.served = served
        listed = ", ".join(served) if served else "(none)"
        super().__init__(f"model {model!r} is not served here; served models: {listed}")
