"""Read a results folder back: DIR/sweep.json (a sweep) or DIR/replay.json (one replay).

A sweep folder may also hold per-point replay files; sweep.json wins because it holds them all.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from planner.errors import ReportError
from planner.sweep.results import SweepResults
from replay.results import ReplayResults

SWEEP_FILE = "sweep.json"
REPLAY_FILE = "replay.json"

Results = SweepResults | ReplayResults


def results_file(results_dir: Path) -> Path:
    """The results file a report is built from; a path to the file itself is accepted too."""
    path = Path(results_dir)
    if path.is_file():
        if path.name not in (SWEEP_FILE, REPLAY_FILE):
            raise ReportError(f"{path}: not a results file; expected {SWEEP_FILE} or {REPLAY_FILE}")
        return path
    if not path.is_dir():
        raise ReportError(f"{path}: no such results folder")
    for name in (SWEEP_FILE, REPLAY_FILE):
        if (path / name).is_file():
            return path / name
    raise ReportError(f"{path}: holds neither {SWEEP_FILE} nor {REPLAY_FILE}; give the folder a sweep or a replay wrote")


def load_results(results_dir: Path) -> tuple[Path, Results]:
    """Return (the file read, its parsed results)."""
    path = results_file(results_dir)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror})") from None
    model = SweepResults if path.name == SWEEP_FILE else ReplayResults
    try:
        return path, model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ReportError(
            f"{path}: field {where}: {first['msg']} ({exc.error_count()} problem(s)); "
            f"is this a {path.name} written by this planner?"
        ) from None
