"""Stopping a planner a test started as a process, and never leaving it behind."""

from __future__ import annotations

import signal
import subprocess


def reap(proc: subprocess.Popen) -> None:
    """Kill a process a failed assertion left running, and wait for it: a live Popen would surface
    later as a 'still running' ResourceWarning in some other test."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def signal_and_wait(proc: subprocess.Popen, sig: signal.Signals, timeout_s: float = 60) -> str | bytes:
    """Send `sig`, wait for the process to end, and return its stderr (reaped if it ignored the signal)."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        reap(proc)
    return err


def terminate_and_wait(proc: subprocess.Popen, timeout_s: float = 10) -> None:
    """Stop a helper process a test started (a Prometheus, a browser): SIGTERM, then SIGKILL if it
    has not ended within timeout_s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
