"""Faults of the catalogue (docs/reference/faults.md) outside a point's search: a port taken
before the server binds it, and a corpus replaced while a sweep reads it."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import pytest

import planner.launcher as launcher
import replay.corpus.jsonl as corpus_mod
from planner.cli import main
from planner.errors import ServerStartFailed
from planner.launcher import VllmServer, group_alive
from planner.sweep.config import load_settings
from planner.sweep.grid import expand, fingerprint
from planner.sweep.results import SweepResults
from replay.corpus.jsonl import load_corpus
from tests.fakes.fault_sweeps import fake_vllm_processes, write_fault_config
from tests.fakes.sweep_files import FAKE_VLLM, write_corpus


@pytest.mark.timeout(60)
def test_a_port_taken_between_the_choice_and_the_bind_fails_the_start_as_port_taken(tmp_path: Path, monkeypatch) -> None:
    """The launcher picks a free port (planner.ports.free_port) and the server binds it a moment
    later; another process taking it in between makes vLLM exit on its bind error: the start fails
    as `port_taken`, the bind error in the log tail, nothing left running."""

    async def race() -> VllmServer:
        taken = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = taken.sockets[0].getsockname()[1]
        # The race, made certain: the choice returns the port the listener already holds.
        monkeypatch.setattr(launcher, "free_port", lambda host: port)
        server = VllmServer(
            [sys.executable, str(FAKE_VLLM)], model="m", args=["--kv-cache-memory-bytes", "2M", "--max-model-len", "1024"],
            log_path=tmp_path / "server.log", startup_timeout_s=30, stop_grace_s=3,
        )  # fmt: skip
        try:
            with pytest.raises(ServerStartFailed) as exc:
                async with server:
                    pass
        finally:
            taken.close()
            await taken.wait_closed()
        failure = exc.value.failure
        assert failure.kind == "port_taken" and failure.exit_code == 1
        assert f"error while attempting to bind on address ('127.0.0.1', {port})" in failure.message
        return server

    server = asyncio.run(race())
    assert server.pgid is not None and not group_alive(server.pgid), "the failed server left a process"


@pytest.mark.timeout(120)
def test_a_sweep_starts_a_server_whose_port_was_taken_again_on_another_port(tmp_path: Path, monkeypatch) -> None:
    """In a sweep, the point's server is started again on a port chosen afresh (PORT_ATTEMPTS in
    all), and the point says so in its notes; the point is measured as if nothing happened."""
    holder = socket.create_server(("127.0.0.1", 0))
    taken = holder.getsockname()[1]
    real = launcher.free_port
    choices: list[int] = []

    def racing_free_port(host: str) -> int:
        choices.append(taken if not choices else real(host))
        return choices[-1]

    monkeypatch.setattr(launcher, "free_port", racing_free_port)
    cfg = write_fault_config(tmp_path, kv_bytes=["4M"])
    out = tmp_path / "out"
    try:
        assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    finally:
        holder.close()
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "ok" and point.max_passing_concurrency is not None
    # The point's two starts, then the fresh-server confirmation's start (planner.sweep.fresh).
    assert len(choices) == 3 and point.command[point.command.index("--port") + 1] == str(choices[1])
    assert point.notes == [
        f"port_taken: another process held port {taken} when the server bound it; started again on another port"
    ]
    assert fake_vllm_processes(cfg) == []


def test_a_server_whose_own_distributed_port_was_taken_is_started_again(tmp_path: Path) -> None:
    """On one node vLLM picks the torch.distributed port of its workers itself; another process
    can hold it by the time a worker listens (torch's EADDRINUSE). The point's server is started
    again (vLLM then picks another), with a note; a second start that finds it taken again too,
    and a third, end the point as master_port_taken, naming torch's line."""
    starts = tmp_path / "starts"
    cfg = write_fault_config(tmp_path, kv_bytes=["4M"], env={"FAKE_VLLM_MASTER_PORT_TAKEN": str(starts)})
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    (point,) = SweepResults.model_validate_json((out / "sweep.json").read_text()).points
    assert point.status == "ok" and point.max_passing_concurrency is not None, point.failure
    (note,) = point.notes
    assert note.startswith("master_port_taken: another process held the torch.distributed port vLLM chose"), note
    assert "EADDRINUSE" in note and note.endswith("; started again")
    assert fake_vllm_processes(cfg) == []

    always = tmp_path / "always"
    always.mkdir()
    cfg = write_fault_config(
        always, kv_bytes=["4M"],
        env={"FAKE_VLLM_MASTER_PORT_TAKEN": str(always / "starts"), "FAKE_VLLM_MASTER_PORT_TAKEN_STARTS": "99"},
    )
    assert main(["sweep", "--config", str(cfg), "--output", str(always / "out")]) == 0
    (point,) = SweepResults.model_validate_json((always / "out" / "sweep.json").read_text()).points
    assert point.status == "failed" and point.failure.kind == "master_port_taken", point.failure
    assert "failed to listen on any local network address" in point.failure.message
    assert len((always / "starts").read_text().splitlines()) == 3 and len(point.notes) == 2
    assert fake_vllm_processes(cfg) == []


def test_a_corpus_replaced_while_a_sweep_reads_it_changes_nothing_measured(tmp_path: Path, monkeypatch) -> None:
    """A sweep reads its corpus once, at its start, through one open file: a corpus renamed over
    (or rewritten) after that, or even while it is read, changes nothing this sweep replays; the
    sha256 it saves (run.corpus.sha256) names what it read. --resume with the new corpus finds
    every fingerprint changed and re-runs every point."""
    cfg = write_fault_config(tmp_path, kv_bytes=["4M", "8M"])
    path = tmp_path / "corpus.jsonl"
    first = load_corpus(path)
    replacement = write_corpus(tmp_path / "other.jsonl", n=7)

    real_parse = corpus_mod._parse_line
    replaced = []

    def parse_then_replace(*args, **kwargs):
        if not replaced:
            os.replace(replacement, path)  # mid-read: the sweep's open file still reads the old one
            replaced.append(True)
        return real_parse(*args, **kwargs)

    write_corpus(path)  # the original again
    monkeypatch.setattr(corpus_mod, "_parse_line", parse_then_replace)
    during = load_corpus(path)
    monkeypatch.undo()
    after = load_corpus(path)
    assert replaced and len(during) == len(first) == 60 and during.sha256 == first.sha256
    assert len(after) == 7 and after.sha256 != first.sha256

    settings = load_settings(cfg, {})
    points = expand(settings)
    old = {fingerprint(settings, p, corpus_sha256=first.sha256, vllm_version="v") for p in points}
    new = {fingerprint(settings, p, corpus_sha256=after.sha256, vllm_version="v") for p in points}
    assert not old & new, "--resume on the new corpus reuses no point"
