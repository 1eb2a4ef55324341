"""Every error the planner raises on purpose; the CLI turns each into one line and an exit code.

    PlannerError
     +-- ConfigError         a settings file, variable or flag is invalid (says which and what is valid)
     +-- LaunchError         a vLLM server could not be launched for a reason that is not the point's
     |                       own (the command is missing, no free port, a misused launcher)
     +-- ServerStartFailed   a point's vLLM was launched but did not become ready; `failure` says why,
     |                       classified from its log (the point fails or is infeasible, the sweep goes on)
     +-- PeerLost            a headless rank's node (or its actor) of a point across nodes went away:
     |                       Ray reruns the point ([executor] max_retries)
     +-- PeerStartFailed     a headless rank's server command could not be run at all (the point fails)
     +-- EstimateError       a model folder cannot be sized (missing or unknown config keys)
     +-- ReportError         a results folder cannot be rendered

replay's own errors (replay.errors.ReplayError) reach the CLI unchanged.
"""

from __future__ import annotations

from pathlib import Path

from planner.capacity import Failure


class PlannerError(Exception):
    pass


class ConfigError(PlannerError):
    pass


class LaunchError(PlannerError):
    pass


class ServerStartFailed(PlannerError):
    """The server did not become ready; `failure` says why (classified from its log)."""

    def __init__(self, failure: Failure, log_path: Path) -> None:
        self.failure = failure
        self.log_path = log_path
        super().__init__(f"vLLM server did not start ({failure.kind}): {failure.message} (log: {log_path})")


class PeerLost(PlannerError):
    """A headless rank's node (or its actor) went away. The point's task raises it so that Ray
    reruns the whole point ([executor] max_retries), as for rank 0's own node. Its second argument
    is the end of rank 0's log, for the node_lost failure once no rerun is left."""

    def __init__(self, message: str, log_tail: list[str] | None = None) -> None:
        super().__init__(message, log_tail or [])
        self.message = message
        self.log_tail = log_tail or []

    def __str__(self) -> str:
        return self.message


class PeerStartFailed(PlannerError):
    """A headless rank's server command could not be run at all (the point fails, no rerun)."""


class EstimateError(PlannerError):
    pass


class ReportError(PlannerError):
    pass
