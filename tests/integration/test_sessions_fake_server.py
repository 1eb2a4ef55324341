"""Session corpora replayed against the fake server: each turn resends the conversation so far,
after its think time, and the step reports sessions beside requests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from replay.corpus.jsonl import load_corpus
from replay.results import ReplayResults
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings
from tests.fakes.openai_server import Behavior, FakeServer, count_messages_tokens


def _conversations(tmp_path: Path, sessions: int) -> Path:
    path = tmp_path / "sessions.jsonl"
    lines = []
    for i in range(sessions):
        lines.append({
            "id": f"s{i}",
            "system": "You answer briefly.",
            "conversation": [
                {"user": f"first question of session {i}", "max_tokens": 4},
                {"user": "and a follow-up", "max_tokens": 3, "think_time_s": 0.3},
                {"user": "one more", "max_tokens": 2, "think_time_s": 0.1, "assistant": "unused: last turn"},
            ],
        })
    # The second session's first reply is recorded: it is sent as history instead of the stream
    # (as long, by the fake's count, as the streamed one).
    lines[1]["conversation"][0]["assistant"] = "recorded!!!!"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


async def _replay(corpus_path: Path, settings: ReplaySettings) -> tuple[ReplayResults, list]:
    async with FakeServer(Behavior(itl_s=0.001)) as srv:
        srv.received = []
        results = await run_replay(url=srv.url, corpus=load_corpus(corpus_path), settings=settings, slo={})
        return results, srv.received


@pytest.mark.timeout(60)
def test_turns_carry_the_history_after_their_think_time(tmp_path: Path) -> None:
    settings = ReplaySettings(concurrency=[2], warmup_requests=0, min_requests=6, max_requests=6)
    results, received = asyncio.run(_replay(_conversations(tmp_path, 2), settings))

    turns_s0 = [(t, p) for t, p in received if p["messages"][1]["content"] == "first question of session 0"]
    assert [len(p["messages"]) for _, p in turns_s0[:3]] == [2, 4, 6]
    (t1, first), (t2, second), (t3, third) = turns_s0[:3]
    # Turn 2 = turn 1's messages, the reply that streamed (the fake streams " t0 t1 ..."), the new turn.
    assert second["messages"] == [
        *first["messages"],
        {"role": "assistant", "content": " t0 t1 t2 t3"},
        {"role": "user", "content": "and a follow-up"},
    ]
    assert third["messages"][:4] == second["messages"] and third["messages"][4]["content"] == " t0 t1 t2"
    # The think times: 0.3 s after turn 1's end (its 4 tokens took a few ms), 0.1 s after turn 2's.
    assert 0.3 <= t2 - t1 < 0.6
    assert 0.1 <= t3 - t2 < 0.4
    turns_s1 = [p for _, p in received if p["messages"][1]["content"] == "first question of session 1"]
    assert turns_s1[1]["messages"][2] == {"role": "assistant", "content": "recorded!!!!"}

    step = results.steps[0]
    assert results.concurrency_unit == "sessions" and results.corpus.sessions == 2 and results.corpus.requests == 6
    s = step.sessions
    assert s is not None
    assert s.sessions_in_flight_peak == 2 and s.requests_in_flight_peak <= 2
    # Users spend most of the time reading: fewer requests than sessions in flight on average.
    assert s.requests_in_flight_mean < s.sessions_in_flight_mean <= 2
    assert sorted(s.by_turn) == ["1", "2", "3"] and all(t.count >= 1 for t in s.by_turn.values())
    # Prompt tokens by the fake's count (the server's usage): turn 2 resends turn 1's prompt and output.
    turn1 = count_messages_tokens(first["messages"])
    assert s.by_turn["1"].prompt_tokens_mean == pytest.approx(turn1)
    assert s.by_turn["2"].resent_tokens_mean == pytest.approx(turn1 + 4)
    assert s.by_turn["2"].prompt_tokens_mean == pytest.approx(count_messages_tokens(second["messages"]))
    assert s.turns_completed >= 6 and s.sessions_completed >= 1


@pytest.mark.timeout(120)
def test_planner_replay_prints_sessions_and_finds_a_max_in_sessions(tmp_path: Path, spawn_fake_server, capsys) -> None:
    from planner.cli import main

    url = spawn_fake_server("--itl-s", "0.002")
    out = tmp_path / "out"
    code = main([
        "replay", "--prompts", str(_conversations(tmp_path, 40)), "--url", url, "--api", "chat",
        "--find-max", "--max-concurrency", "4", "--min-requests", "12", "--think-time-s", "0.05",
        "--think-time-distribution", "fixed", "--slo", "error_rate=0", "--output", str(out),
    ])
    assert code == 0
    printed = capsys.readouterr().out
    results = ReplayResults.model_validate_json((out / "replay.json").read_text())
    # Nothing fails on this server: the cap, in sessions, passes.
    assert results.concurrency_unit == "sessions" and results.max_passing_concurrency == 4
    assert results.settings["think_time_s"] == 0.05 and results.settings["think_time_distribution"] == "fixed"
    assert "concurrency counts sessions (users in flight), not requests" in printed
    assert "c=4: sessions in flight 4.0 (peak 4), requests in flight" in " ".join(printed.split())
    assert all(s.sessions is not None and s.sessions.sessions_in_flight_peak == 4 for s in results.steps)
    report = (out / "report.md").read_text()
    assert "## Sessions" in report and "| 4 | 4 / 4 |" in report and "TTFT p50 ms by turn (count)" in report
    assert '<a href="#sessions">Sessions</a>' in (out / "report.html").read_text()
