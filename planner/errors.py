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
    """Base class of every error the planner raises on purpose.

    What to do: read the one line it printed: it names what, where and what is valid."""


class ConfigError(PlannerError):
    """A settings file, environment variable or flag is invalid: the message names the key or flag,
    its line in the file, and what is valid.

    What to do: fix that key or flag; `planner sweep --config FILE --dry-run` checks a file
    without starting anything."""


class LaunchError(PlannerError):
    """A vLLM server could not be launched for a reason that is not the point's own: the command is
    missing, no port is free, the launcher was misused.

    What to do: check `[server] command` (is `vllm` on PATH, in the right environment?) and the
    ports in use."""


class ServerStartFailed(PlannerError):
    """The server did not become ready; `failure` says why (classified from its log).

    What to do: a sweep records it as the point's `failure` and goes on; read the point's
    server.log (its path is in the message), and see `failure.kind` in the result fields."""

    def __init__(self, failure: Failure, log_path: Path) -> None:
        self.failure = failure
        self.log_path = log_path
        super().__init__(f"vLLM server did not start ({failure.kind}): {failure.message} (log: {log_path})")


class PeerLost(PlannerError):
    """A headless rank's node (or its actor) went away. The point's task raises it so that Ray
    reruns the whole point ([executor] max_retries), as for rank 0's own node. Its second
    argument is the end of rank 0's log, for the node_lost failure once no rerun is left.

    What to do: nothing while reruns are left; once `[executor] max_retries` are spent the point
    is `failed` with kind `node_lost`: check the node, then `--resume`."""

    def __init__(self, message: str, log_tail: list[str] | None = None) -> None:
        super().__init__(message, log_tail or [])
        self.message = message
        self.log_tail = log_tail or []

    def __str__(self) -> str:
        return self.message


class PeerStartFailed(PlannerError):
    """A headless rank's server command could not be run at all (the point fails, no rerun).

    What to do: check that every node has the server command (`[server] command`) and the model."""


class EstimateError(PlannerError):
    """A model cannot be sized: a config.json with missing or unknown keys, a model that cannot be
    read (no such model, no access, gated, unknown revision, not in the cache while offline).

    What to do: check the model's name or folder; for a gated Hub model accept its licence and
    set HF_TOKEN."""


class ReportError(PlannerError):
    """A results folder cannot be read or rendered (no sweep.json or replay.json, not valid JSON,
    not a results file).

    What to do: point `planner report` (or `compare`) at the folder a run wrote, or at its JSON
    file."""
