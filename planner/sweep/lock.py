"""One results folder, one sweep: a lock file that a second sweep into the same folder meets.

Two sweeps writing one sweep.json would each overwrite the other's points, and their servers' logs
would share a file. The first sweep holds `.sweep.lock` in the folder: an advisory lock
(fcntl.flock) on the file, with the holder's pid and host written in it for the message. The
kernel drops the lock when its holder ends, however it ends (SIGKILL and OOM kills included), so
a lock file left by a dead sweep is free to take; the next sweep says whose it was and takes it.

    with SweepLock(folder):      # SweepLocked when a live sweep holds it
        ...

The lock is advisory: it binds planners, not an operator's `rm`. Over NFS flock reaches the
server only with `local_lock=none` (the Linux default), as for any flock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from planner.errors import PlannerError

LOCK_FILE = ".sweep.lock"


class SweepLocked(PlannerError):
    """Another sweep, still running, holds the results folder (its pid is in the message), or the
    folder cannot hold or lock its lock file (.sweep.lock).

    What to do: wait for that sweep to end, stop it, or give another --output; for a folder that
    cannot be locked, give an --output on a filesystem with file locks. A lock left by a sweep
    that died is taken over by itself, with a message."""


def _notice(line: str) -> None:
    print(f"planner sweep: {line}", file=sys.stderr, flush=True)


def _holder(text: str) -> tuple[int | None, str | None]:
    """The pid and host a lock file names (None where it names none: an empty or foreign file)."""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    pid = fields.get("pid", "")
    return (int(pid) if pid.isdigit() else None), fields.get("host")


class SweepLock:
    """Holds `folder`/.sweep.lock for as long as the block runs."""

    def __init__(self, folder: Path, *, notice: Callable[[str], None] = _notice) -> None:
        self.path = Path(folder) / LOCK_FILE
        self._notice = notice
        self._fd: int | None = None

    def __enter__(self) -> SweepLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise SweepLocked(f"{self.path}: cannot create the results folder's lock file: {exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 256, 0).decode(errors="replace")
                os.close(fd)
                pid, host = _holder(text)
                who = f"pid {pid}" if pid is not None else "another process"
                if host and host != socket.gethostname():
                    who += f" on {host}"
                raise SweepLocked(
                    f"{self.path.parent}: another sweep ({who}) is writing results into this folder (lock file"
                    f" {self.path}); wait for it to end, stop it, or give another --output"
                ) from None
            except OSError as exc:
                # A filesystem without locks (an NFS mount with nolock, say): one sweep per folder
                # cannot be kept, and two would overwrite each other's results.
                os.close(fd)
                raise SweepLocked(
                    f"{self.path}: cannot lock the results folder: {exc.strerror}; give an --output on a filesystem"
                    " that supports file locks"
                ) from None
            # The holder before us may have removed the file between our open and our lock: a lock
            # on a file no longer at the path guards nothing, so open the path again.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        earlier = os.pread(fd, 256, 0).decode(errors="replace")
        pid, host = _holder(earlier)
        if pid is not None and pid != os.getpid():
            where = f" on {host}" if host and host != socket.gethostname() else ""
            self._notice(
                f"{self.path}: taking over the lock of sweep pid {pid}{where}, which no longer holds it"
                " (it ended without removing its lock file: killed, or its machine restarted)"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is None:
            return
        # Removed while still locked, so that no sweep sees a lock file without a holder it could
        # have taken over from a live one.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None
