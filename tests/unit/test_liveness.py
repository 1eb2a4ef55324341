"""The watch's two judgements without a server: which processes of a group are stopped, and when
timed-out requests add up to stalled streams (planner.sweep.liveness)."""

from __future__ import annotations

from pathlib import Path

from planner.sweep.liveness import Liveness, stopped_in_group
from replay.records import RequestRecord


def write_stat(proc: Path, pid: int, comm: str, state: str, pgrp: int) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 {pgrp} {pgrp} 0 -1 4194560\n")


def test_stopped_and_traced_processes_of_the_group_are_found_and_others_are_not(tmp_path):
    write_stat(tmp_path, 100, "python3", "T", 100)
    write_stat(tmp_path, 101, "VLLM::EngineCore (x) y", "t", 100)  # comm with spaces and parentheses
    write_stat(tmp_path, 102, "python3", "S", 100)
    write_stat(tmp_path, 200, "other", "T", 200)
    (tmp_path / "self").mkdir()
    assert sorted(stopped_in_group(100, tmp_path)) == [(100, "T"), (101, "t")]
    assert stopped_in_group(300, tmp_path) == []


def record(*, error: str | None, send: float, end: float, tokens: list[float] = ()) -> RequestRecord:
    return RequestRecord(request_id="r", send_s=send, end_s=end, token_times_s=list(tokens), error=error)


def test_three_silent_timeouts_in_a_row_are_a_stall_and_a_completed_request_resets_the_count():
    watch = Liveness(server=None, request_timeout_s=10, stalled_requests=3)  # type: ignore[arg-type]
    silent = record(error="timeout", send=0.0, end=10.0, tokens=[0.5])  # 9.5 s of silence at its end
    watch.request_finished(silent, measured=True)
    watch.request_finished(silent, measured=True)
    watch.request_finished(record(error=None, send=0, end=1, tokens=[0.5, 1.0]), measured=True)
    watch.request_finished(silent, measured=True)
    watch.request_finished(silent, measured=True)
    assert not watch.stalled
    # A long generation that ran out of time while tokens still came is slow, not stalled; other
    # errors are the error_rate SLO's business.
    watch.request_finished(record(error="timeout", send=0.0, end=10.0, tokens=[9.0, 9.9]), measured=True)
    watch.request_finished(record(error="http_500", send=0.0, end=0.1), measured=True)
    assert not watch.stalled
    watch.request_finished(record(error="timeout", send=0.0, end=10.0), measured=False)  # nothing at all
    assert watch.stalled
