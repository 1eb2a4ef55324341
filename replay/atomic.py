"""Files that appear whole or not at all: written beside their place and renamed over it, so a
reader (a dashboard, a resumed sweep, `planner report`) sees the old file or the new one, never
half of either. They get the mode any new file gets (0666 less the umask, 0644 usually), like
the reports and plots beside them: a results folder may be shared with a team, a CI artifact or
a container volume."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def _umask() -> int:
    # Linux tells it without changing it; elsewhere set and restore it (os.umask has no getter).
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_text(path: Path, *, newline: str | None = None) -> Iterator[IO[str]]:
    """A text file (UTF-8) that replaces `path` once the block ends without an error; on an
    error (or a cancel) `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp makes the file 0600 whatever the umask.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
