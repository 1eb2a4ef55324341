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
    """Base class of every error replay raises on purpose."""


class CorpusError(ReplayError):
    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}: " if path is not None and line is not None else (f"{path}: " if path else "")
        super().__init__(f"{where}{message}")


class SloSpecError(ReplayError):
    pass


class StepAborted(ReplayError):
    pass


class ServerError(ReplayError):
    pass


class ServerUnreachable(ServerError):
    pass


class AuthError(ServerError):
    pass


class ModelNotServed(ServerError):
    def __init__(self, model: str, served: list[str]) -> None:
        self.model = model
        self.served = served
        listed = ", ".join(served) if served else "(none)"
        super().__init__(f"model {model!r} is not served here; served models: {listed}")
