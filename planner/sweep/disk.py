"""A disk that fills up while a sweep writes its results.

sweep.json is rewritten whole after every step (replay.atomic: a temporary file renamed over it),
so a write that runs out of space fails on the temporary file and the previous sweep.json stays
as it was. The sweep cannot go on without saving (every step after would be measured and then
lost), so it stops with one error that says where and how much room there is; `--resume` once
there is room continues from the last file written.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any

from planner.errors import PlannerError

# No space, or the user's quota is spent: the same to a sweep.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


class ResultsNotWritten(PlannerError):
    """The results file could not be written for want of space (ENOSPC, or a spent quota); the
    message names it, the free space and the size it needs. The previous file is intact.

    What to do: make room on that filesystem, then run the same command with --resume."""

    @classmethod
    def no_space(cls, path: Path, data: Any, exc: OSError) -> ResultsNotWritten:
        try:
            free = _size(shutil.disk_usage(path.parent).free)
        except OSError:
            free = "unknown"
        needed = len(json.dumps(data, indent=2)) + 1
        try:
            previous = f"the previous {path.name} ({_size(path.stat().st_size)}) is intact"
        except FileNotFoundError:
            previous = f"no {path.name} was written yet"
        return cls(
            f"{path}: cannot save the results: {exc.strerror or 'no space left on device'} ({free} free on its"
            f" filesystem, the file needs {_size(needed)}); {previous}. Make room, then run the same command with"
            " --resume"
        )
