"""The commands the guides mark "needs a vLLM server" run for real, against the fake server.

Each command is the page's own, with two changes: its --url points at the fake server in its own
process (vLLM's metrics, streaming and usage, fast tokens), and its windows are cut to 20 requests
(--min-requests 20 --max-requests 20) so that a step takes seconds. Every other flag, the corpus
and the output folder are as the page shows them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replay.results import ReplayResults
from tests.unit.test_docs_examples import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SERVER_COMMANDS = [c for c in COMMANDS if c.needs == "needs a vLLM server"]
SHORT_WINDOWS = ["--min-requests", "20", "--max-requests", "20"]


def test_the_guides_mark_server_commands():
    assert len(SERVER_COMMANDS) >= 4 and all(c.argv[:2] == ["planner", "replay"] for c in SERVER_COMMANDS)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", SERVER_COMMANDS, ids=str)
def test_server_command_runs_against_the_fake_server(command, spawn_fake_server, tmp_path: Path):
    url = spawn_fake_server("--itl-s", "0.0002", "--ttft-s", "0.001")
    argv = command.argv[1:]
    assert "--url" in argv, f"{command}: no --url to point at the fake server"
    argv[argv.index("--url") + 1] = url
    (tmp_path / "prompts").symlink_to(ROOT / "prompts")
    done = subprocess.run(
        [sys.executable, "-m", "planner", *argv, *SHORT_WINDOWS],
        cwd=tmp_path, capture_output=True, text=True, timeout=220,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-3000:]}"
    if "--output" in argv:
        results = ReplayResults.model_validate_json((tmp_path / argv[argv.index("--output") + 1] / "replay.json").read_text())
        assert results.steps and all(s.requests_ok + s.requests_failed > 0 for s in results.steps)
        assert results.find_max == ("--find-max" in argv)
