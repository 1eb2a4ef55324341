"""`planner prompts sharegpt` and `planner prompts chatlog`: conversations people have, as sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from replay.corpus.chatlog import group_chat_log
from replay.corpus.jsonl import load_corpus
from replay.errors import CorpusError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
HAIKU = "A haiku is a short Japanese poem with three lines of five, seven and five syllables."
RAIN = "Soft rain on the roof, / the gutters hum their old song, / puddles hold the sky."


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_sharegpt_conversations_become_sessions_with_recorded_replies(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main(["prompts", "sharegpt", str(FIXTURES / "sharegpt.json"), str(out)]) == 0
    assert capsys.readouterr().out == f"converted 3 conversations to sessions in {out}; skipped 2 with no human turn\n"
    first = read_jsonl(out)[0]
    # 84 bytes -> 21 tokens; 78 -> 20 (replay.corpus.lengths' estimate).
    assert first == {
        "id": "sg-1",
        "system": "You are a helpful assistant.",
        "conversation": [
            {"user": "What is a haiku?", "assistant": HAIKU, "max_tokens": 21},
            {"user": "Write one about rain.", "assistant": RAIN, "max_tokens": 20},
        ],
    }
    corpus = load_corpus(out)
    assert [(s.id, len(s.turns)) for s in corpus.sessions] == [("sg-1", 2), ("3", 1), ("sharegpt-3", 1)]


def test_sharegpt_single_request_is_the_older_form(tmp_path):
    new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    assert main(["prompts", "sharegpt", "--single-request", "--max-tokens-from-reply", str(FIXTURES / "sharegpt.json"), str(new)]) == 0
    assert main(["prompts", "convert", "--from", "sharegpt", "--max-tokens-from-reply", str(FIXTURES / "sharegpt.json"), str(old)]) == 0
    assert new.read_bytes() == old.read_bytes()


def test_sharegpt_replies_before_the_first_question_and_after_an_empty_one_are_left_out(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "x", "conversations": [
        {"from": "gpt", "value": "Hi!"}, {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a"},
        {"from": "gpt", "value": "b"}, {"from": "human", "value": "q2"}, {"from": "human", "value": ""},
        {"from": "gpt", "value": "never"},
    ]}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["prompts", "sharegpt", str(src), str(out)]) == 0
    assert read_jsonl(out) == [{"id": "x", "conversation": [
        {"user": "q1", "assistant": "a\n\nb", "max_tokens": 1}, {"user": "q2"},
    ]}]


def _msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def test_a_chat_log_groups_by_repeated_prefixes(tmp_path, capsys):
    sys_, u1, a1, u2, a2, u3 = (
        _msg("system", "Be brief."), _msg("user", "hello"), _msg("assistant", "hi there"),
        _msg("user", "how are you"), _msg("assistant", "fine"), _msg("user", "bye"),
    )
    other = [sys_, _msg("user", "another chat")]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in [
        {"messages": [sys_, u1], "timestamp_s": 5.0, "max_tokens": 9},
        {"messages": other},
        {"messages": [sys_, u1, a1, u2]},
        {"messages": [*other, _msg("assistant", "ok"), _msg("user", "more")]},
        {"messages": [sys_, u1, a1, u2, a2, u3]},
        # The same first turn again, answered differently: a session of its own (a regenerated reply).
        {"messages": [sys_, u1]},
    ]))
    out = tmp_path / "out.jsonl"
    assert main(["prompts", "chatlog", str(log), str(out)]) == 0
    assert capsys.readouterr().out == f"grouped 6 logged requests into 3 sessions (6 turns) in {out}\n"
    rows = read_jsonl(out)
    assert rows[:3] == [
        {"session_id": "chat-1", "turn": 1, "messages": [sys_, u1], "timestamp_s": 5.0, "max_tokens": 9, "assistant": "hi there"},
        {"session_id": "chat-1", "turn": 2, "messages": [u2], "assistant": "fine", "max_tokens": 1},
        {"session_id": "chat-1", "turn": 3, "messages": [u3]},
    ]
    assert [(r["session_id"], r["turn"]) for r in rows[3:]] == [("chat-2", 1), ("chat-2", 2), ("chat-3", 1)]
    corpus = load_corpus(out)
    assert [len(s.turns) for s in corpus.sessions] == [3, 2, 1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1]", "expected an object with 'messages'"),
        ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}', "the last message is the assistant's"),
        ('{"messages": [{"role": "user"}]}', "messages[0] has no 'content'"),
        ('{"messages": [{"role": "user", "content": "q"}], "max_tokens": 0}', "field 'max_tokens' is an integer (0)"),
    ],
)
def test_bad_chat_log_lines_name_the_line(tmp_path, line, message):
    log = tmp_path / "log.jsonl"
    log.write_text('{"messages": [{"role": "user", "content": "ok"}]}\n' + line + "\n")
    with pytest.raises(CorpusError) as err:
        group_chat_log(log, tmp_path / "out.jsonl")
    assert str(err.value).startswith(f"{log}:2: ") and message in str(err.value)
    assert not (tmp_path / "out.jsonl").exists()
