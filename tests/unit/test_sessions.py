"""Session corpora: the two line forms, their validation (file:line), think times, and how a
step schedules sessions (closed loop of users, Poisson and trace arrivals) on a virtual clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.corpus.jsonl import load_corpus
from replay.errors import CorpusError
from replay.load.conversation import Occupancy, SessionCursor, ThinkTime, mean_think_per_request_s
from replay.load.kinds import Concurrency, PoissonRate, TraceReplay
from replay.step.run import run_step
from replay.step.window import Window
from tests.fakes.senders import SleepySender
from tests.fakes.virtual_time import run_virtual, virtual_clock


def write(tmp_path: Path, *objs) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs), encoding="utf-8")
    return path


def turn(sid, n, **kw):
    return {"session_id": sid, "turn": n, "prompt": f"{sid} turn {n}", **kw}


def test_turn_lines_gather_into_sessions_in_order_of_first_turn(tmp_path):
    corpus = load_corpus(write(
        tmp_path,
        turn("b", 1, timestamp_s=2.0, max_tokens=5),
        turn("a", 1, timestamp_s=1.0),
        turn("b", 2, think_time_s=1.5, assistant="recorded"),
        {"session_id": 7, "turn": 1, "messages": [{"role": "user", "content": "hi"}], "id": "mine"},
    ))
    assert [(s.id, [t.turn for t in s.turns]) for s in corpus.sessions] == [("b", [1, 2]), ("a", [1]), ("7", [1])]
    b2 = corpus.sessions[0].turns[1]
    assert (b2.id, b2.line, b2.think_time_s, b2.assistant, b2.extra) == ("b#2", 3, 1.5, "recorded", {})
    assert corpus.sessions[2].turns[0].id == "mine"
    assert len(corpus) == 4 and corpus.has_timestamps is False
    assert [s.timestamp_s for s in corpus.sessions[:2]] == [2.0, 1.0]


def test_a_conversation_line_is_a_whole_session(tmp_path):
    corpus = load_corpus(write(tmp_path, {
        "id": "c1", "system": "Be brief.", "timestamp_s": 3,
        "conversation": [{"user": "one", "max_tokens": 8, "assistant": "ok"}, {"user": "two", "think_time_s": 2}],
    }, {"conversation": [{"user": "alone"}]}))
    first, second = corpus.sessions
    assert [t.messages for t in first.turns] == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one"}],
        [{"role": "user", "content": "two"}],
    ]
    assert [(t.id, t.turn, t.max_tokens, t.assistant, t.think_time_s, t.line) for t in first.turns] == [
        ("c1#1", 1, 8, "ok", None, 1), ("c1#2", 2, None, None, 2.0, 1),
    ]
    assert first.timestamp_s == 3.0 and second.id == "line-2" and [r.index for r in corpus.requests] == [0, 1, 2]


def test_a_plain_corpus_has_no_sessions(tmp_path):
    assert load_corpus(write(tmp_path, {"prompt": "x"})).sessions is None


@pytest.mark.parametrize(
    ("lines", "bad_line", "message"),
    [
        ([turn("a", 2)], 1, "turn 2 of session 'a', but none of its earlier turns comes before it"),
        ([turn("a", 1), turn("a", 3)], 2, "turn 3 of session 'a', but only its turns 1-1 come before it"),
        ([turn("a", 1), turn("a", 2), turn("a", 2)], 3, "turn 2 of session 'a' again (first at line 2)"),
        ([{"prompt": "x"}, turn("a", 1)], 2, "a session turn in a corpus whose line 1 is a plain request"),
        ([turn("a", 1), {"conversation": [{"user": "u"}]}], 2, "a conversation in a corpus whose line 1 is a session turn"),
        ([{"id": "c", "conversation": [{"user": "u"}]}, {"id": "c", "conversation": [{"user": "v"}]}], 2,
         "session 'c' again (first at line 1)"),
        ([turn("a", 1, think_time_s=1)], 1, "field 'think_time_s' on turn 1"),
        ([turn("a", 1), turn("a", 2, timestamp_s=4)], 2, "'timestamp_s' on turn 2 of session 'a'"),
        ([turn("a", 1), turn("a", 2, think_time_s=-1)], 2, "field 'think_time_s' is an integer (-1); it must be a number >= 0"),
        ([{"prompt": "x", "think_time_s": 1}], 1, "field 'think_time_s' belongs to a session's turn"),
        ([{"session_id": "a", "prompt": "x"}], 1, "field 'turn' is null; a session's line needs 'turn'"),
        ([{"turn": 1, "prompt": "x"}], 1, "field 'session_id' is null"),
        ([turn("a", 1, assistant=3)], 1, "field 'assistant' is an integer (3); it must be a string"),
        ([{"conversation": [{"user": "u"}], "prompt": "x"}], 1, "a conversation line has 'prompt'"),
        ([{"conversation": []}], 1, "field 'conversation' is a list; it must be a non-empty list"),
        ([{"conversation": [{"user": "u", "reply": "r"}]}], 1, "conversation[0] has 'reply'"),
        ([{"conversation": [{"user": ""}]}], 1, "conversation[0] field 'user' is a string (\"\")"),
        ([{"conversation": [{"user": "u"}, {"user": "v", "max_tokens": 0}]}], 1, "conversation[1] field 'max_tokens'"),
    ],
)
def test_bad_sessions_name_file_line_and_what_is_valid(tmp_path, lines, bad_line, message):
    path = write(tmp_path, *lines)
    with pytest.raises(CorpusError) as err:
        load_corpus(path)
    assert str(err.value).startswith(f"{path}:{bad_line}: ")
    assert message in str(err.value)


def test_skipping_a_bad_turn_skips_the_turns_after_it(tmp_path):
    corpus = load_corpus(
        write(tmp_path, turn("a", 1), turn("a", 2, max_tokens=0), turn("a", 3), turn("b", 1)), skip_invalid=True
    )
    assert corpus.skipped_invalid == 2
    assert [(s.id, len(s.turns)) for s in corpus.sessions] == [("a", 1), ("b", 1)]


def test_think_times_come_from_the_line_else_the_seeded_default(tmp_path):
    corpus = load_corpus(write(tmp_path, turn("a", 1), turn("a", 2, think_time_s=4.0), turn("a", 3), turn("b", 1), turn("b", 2)))
    a1, a2, a3 = corpus.sessions[0].turns
    b2 = corpus.sessions[1].turns[1]
    assert ThinkTime(2.0, "fixed").seconds(a1) == 0.0
    assert ThinkTime(2.0, "fixed").seconds(a2) == 4.0
    assert ThinkTime(2.0, "fixed").seconds(a3) == 2.0
    exp = ThinkTime(2.0, "exponential", seed=1)
    # A draw depends on (seed, session, turn) only: the same again, another for another session or seed.
    assert exp.seconds(a3) == exp.seconds(a3) != exp.seconds(b2)
    assert exp.seconds(a3) != ThinkTime(2.0, "exponential", seed=2).seconds(a3)
    draws = [ThinkTime(2.0, "exponential", seed=s).seconds(a3) for s in range(2000)]
    assert sum(draws) / len(draws) == pytest.approx(2.0, rel=0.1)


def test_occupancy_is_time_weighted_over_the_window():
    occ = Occupancy()
    occ.change(0.0, +1)
    occ.change(1.0, +2)  # 3 from 1 s
    occ.change(2.0, -3)  # 0 from 2 s
    assert occ.over(0.5, 2.5) == (pytest.approx((0.5 * 1 + 1 * 3) / 2.0), 3)
    assert occ.over(2.0, 3.0) == (0.0, 0)
    assert occ.over(3.0, 3.0) == (None, None)


def _sessions(tmp_path, n: int, turns: int = 2, think_s: float | None = None, stamp=None):
    lines = []
    for i in range(n):
        for k in range(1, turns + 1):
            extra = {"think_time_s": think_s} if think_s is not None and k > 1 else {}
            if k == 1 and stamp is not None:
                extra["timestamp_s"] = stamp(i)
            lines.append(turn(f"s{i}", k, **extra))
    return load_corpus(write(tmp_path, *lines)).sessions


def virtual_step(sender, sessions, load, window, **kw):
    sender.clock = virtual_clock
    return run_virtual(run_step(
        sender, SessionCursor(sessions), load, window, sessions=sessions, clock=virtual_clock, **kw
    ))


def test_closed_loop_keeps_n_users_and_fewer_requests_in_flight(tmp_path):
    # Each user: a 0.1 s request, 0.1 s reading, a 0.1 s request, then a new session at once:
    # requests are in flight 2/3 of the time.
    sessions = _sessions(tmp_path, 50, think_s=0.1)
    sender = SleepySender(latency_s=0.1, ttft_s=0.01)
    result = virtual_step(sender, sessions, Concurrency(6), Window(warmup_requests=6, min_requests=60, max_requests=60))
    s = result.sessions
    assert s.sessions_in_flight_peak == 6 and s.sessions_in_flight_mean == pytest.approx(6, rel=0.02)
    assert s.requests_in_flight_mean == pytest.approx(4, rel=0.1) and s.requests_in_flight_peak == 6
    assert sender.peak == 6
    assert sorted(s.by_turn) == ["1", "2"]
    assert s.by_turn["1"].count + s.by_turn["2"].count == result.requests_ok
    # Turn 2 resends turn 1's prompt and reply: the sender's usage says 10 + 2 tokens.
    assert (s.by_turn["2"].resent_tokens_mean, s.by_turn["1"].resent_tokens_mean) == (12, 0)
    assert s.resent_tokens > 0 and s.resent_tokens % 12 == 0
    assert s.sessions_completed >= 20 and s.turns_completed >= 60
    # Turn 2 carries turn 1 and the reply that streamed.
    second = next(r for r in sender.requests if r.id.endswith("#2"))
    sid = second.id.split("#")[0]
    assert [m["content"] for m in second.messages] == [f"{sid} turn 1", f"reply to {sid}#1", f"{sid} turn 2"]


def test_poisson_arrivals_are_sessions(tmp_path):
    sessions = _sessions(tmp_path, 400, turns=3, think_s=0.5)
    sender = SleepySender(latency_s=0.1, ttft_s=0.01)
    result = virtual_step(sender, sessions, PoissonRate(20.0, seed=3), Window(warmup_requests=40, min_requests=300, max_requests=300))
    s = result.sessions
    # Little's law: 20 sessions/s, each 3 x 0.1 s of requests and 2 x 0.5 s of reading.
    assert s.sessions_in_flight_mean == pytest.approx(20 * 1.3, rel=0.25)
    assert s.requests_in_flight_mean == pytest.approx(20 * 0.3, rel=0.25)
    assert s.sessions_started == pytest.approx(20 * result.window_s, rel=0.25)


def test_trace_sends_first_turns_at_the_sessions_timestamps(tmp_path):
    sessions = _sessions(tmp_path, 5, turns=2, think_s=0.2, stamp=lambda i: 10.0 + i)
    sender = SleepySender(latency_s=0.1, ttft_s=0.01)
    result = virtual_step(sender, sessions, TraceReplay(speed=2.0), Window(min_requests=1000))
    firsts = sorted((t, rid) for t, rid in sender.sent if rid.endswith("#1"))
    seconds = {rid.split("#")[0]: t for t, rid in sender.sent if rid.endswith("#2")}
    t0 = firsts[0][0]
    assert [round(t - t0, 6) for t, _ in firsts] == [0.0, 0.5, 1.0, 1.5, 2.0]
    # The second turn: the first's 0.1 s, then 0.2 s of reading.
    assert all(seconds[rid.split("#")[0]] - t == pytest.approx(0.3) for t, rid in firsts)
    assert result.window_closed_by == "trace_end" and result.sessions.sessions_completed == 5


def test_a_window_sized_from_the_warm_up_counts_the_users_think_time(tmp_path):
    # Two-turn sessions, 1 s of reading before turn 2: half the turns wait 1 s, so a user's cycle
    # per request is 0.1 s + 0.5 s. The window's limit must allow for it, or it closes on time
    # long before its requests (unresolved).
    sessions = _sessions(tmp_path, 100, think_s=1.0)
    think = mean_think_per_request_s(sessions, ThinkTime())
    assert think == pytest.approx(0.5)
    window = Window(warmup_requests=4, min_requests=40, max_requests=40, max_window_s=None, think_per_request_s=think)
    sender = SleepySender(latency_s=0.1, ttft_s=0.01)
    result = virtual_step(sender, sessions, Concurrency(4), window)
    # 2 x (D + 40 x D / 4) with D = 0.1 + 0.5, the warm-up's mean duration plus the think time.
    assert result.window_limit_s == pytest.approx(2 * (0.6 + 40 * 0.6 / 4), rel=0.02)
    assert result.window_closed_by == "requests" and result.requests_ok + result.steady_state_dropped >= 40
