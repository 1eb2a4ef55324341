"""The sweep.json an earlier run left in the results folder: read for --resume (one line naming the
file and the byte where it stops being readable), or moved aside for --restart. Nothing here
deletes a results file.

A sweep.json is written atomically (replay.atomic), so a killed planner leaves the old file or the
new one, never half of either; a broken one comes from a hand edit, a copy cut short or a disk
that failed, and the planner cannot tell which of its points to trust.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from planner.errors import ConfigError
from planner.sweep.results import SweepResults

RESTART_HINT = "run again with --restart to start over (it moves this file aside, deleting nothing)"


def _notice(line: str) -> None:
    print(f"planner sweep: {line}", file=sys.stderr, flush=True)


class EarlierUnreadable(ConfigError):
    """The folder's sweep.json cannot be resumed from: not UTF-8, not JSON, or not a sweep's
    results; the message names the byte (or the field) where it stops being readable.

    What to do: repair the file by hand, or run again with --restart, which moves it aside
    (renamed sweep.restarted-STAMP.json, deleting nothing) and runs every point."""


def read_earlier(path: Path) -> SweepResults | None:
    """The results in `path` (None when there is no such file); EarlierUnreadable, one line, when
    they cannot be read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EarlierUnreadable(f"{path}: not UTF-8 at byte {exc.start} of {len(raw)}; {RESTART_HINT}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        at = len(text[: exc.pos].encode("utf-8"))
        raise EarlierUnreadable(
            f"{path}: not valid JSON at byte {at} of {len(raw)} (line {exc.lineno}, column {exc.colno}: {exc.msg});"
            f" {RESTART_HINT}"
        ) from None
    try:
        return SweepResults.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise EarlierUnreadable(
            f"{path}: valid JSON but not a sweep's results: {where}: {first['msg']}{more}; {RESTART_HINT}"
        ) from None


def remove_stale_temporaries(path: Path, *, notice=_notice) -> list[Path]:
    """The half-written temporaries of `path` (replay.atomic's `.NAME.*.tmp`) that a writer killed
    mid-write left beside it. Called with the folder's lock held, so no live writer owns them; the
    file they were to replace is whole."""
    stale = sorted(path.parent.glob(f".{path.name}.*.tmp"))
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    if stale:
        notice(f"removed {len(stale)} half-written temporary file(s) of {path.name} left by a killed sweep")
    return stale


def _aside_name(path: Path, why: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.stem}.{why}-{stamp}{path.suffix}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}.{why}-{stamp}-{n}{path.suffix}")
    return candidate


def set_aside(path: Path, *, restart: bool = True, notice=_notice) -> Path | None:
    """Move the folder's sweep.json aside (renamed beside it, kept whole) before a sweep starts
    over: asked for with --restart, or a sweep without --resume into a folder that holds one (it
    would otherwise overwrite it at its first save). None when there was none."""
    if not path.exists():
        return None
    aside = _aside_name(path, "restarted" if restart else "replaced")
    path.rename(aside)
    if restart:
        notice(f"--restart: the earlier results are kept as {aside}; this sweep starts over")
    else:
        notice(
            f"{path} held an earlier sweep's results, kept as {aside}; this sweep starts over"
            " (--resume continues an earlier sweep instead)"
        )
    return aside


def keep_partial(path: Path, earlier: SweepResults, finished: set[str], *, notice=_notice) -> Path | None:
    """--resume re-runs every point that did not finish, from its start, so the steps such a point
    had measured would be gone once sweep.json is rewritten: a copy of the earlier file keeps them
    (None when no unfinished point had measured anything)."""
    partial = [p.id for p in earlier.points if p.status not in finished and p.steps]
    if not partial:
        return None
    copy = _aside_name(path, "before-resume")
    tmp = copy.with_name(f".{copy.name}.tmp")
    shutil.copyfile(path, tmp)
    os.replace(tmp, copy)  # whole or not at all, as every results file
    notice(
        f"--resume re-runs {', '.join(partial)} from the start; the steps measured before are kept in {copy}"
    )
    return copy
