"""The vLLM version a server command will run, learnt before starting it (for --resume)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

_TIMEOUT_S = 60.0


def version_command(command: Sequence[str]) -> list[str] | None:
    """A command that prints the version, or None when the launcher cannot know (a container)."""
    if len(command) >= 3 and command[1] == "-m" and command[2].startswith("vllm."):
        return [command[0], "-c", "import vllm; print(vllm.__version__)"]
    if len(command) >= 2 and os.path.basename(command[0]) == "vllm" and command[1] == "serve":
        return [command[0], "--version"]
    return None


def probe_version(command: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    probe = version_command(command)
    if probe is None:
        return None
    try:
        out = subprocess.run(
            probe,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            env={**os.environ, **(env or {})},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[-1] if out.returncode == 0 and lines else None
