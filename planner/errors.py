"""Errors the planner raises on purpose; the CLI turns each into one line and an exit code.

    PlannerError
     +-- ConfigError        a settings file, variable or flag is invalid (says which and what is valid)
     +-- ServerStartError   a vLLM server could not be started for a reason that is not the point's
                            own (the command is missing, no free port, ...)
     +-- EstimateError      a model folder cannot be sized (missing or unknown config keys)
     +-- ReportError        a results folder cannot be rendered

replay's own errors (replay.errors.ReplayError) reach the CLI unchanged.
"""

from __future__ import annotations


class PlannerError(Exception):
    pass


class ConfigError(PlannerError):
    pass


class ServerStartError(PlannerError):
    pass


class EstimateError(PlannerError):
    pass


class ReportError(PlannerError):
    pass
