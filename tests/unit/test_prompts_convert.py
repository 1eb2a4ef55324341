"""`planner prompts convert --from sharegpt`: conversations become messages requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from replay.corpus.jsonl import load_corpus
from replay.corpus.sharegpt import convert_sharegpt
from replay.errors import CorpusError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"

EXPECTED = [
    {
        "id": "sg-1",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is a haiku?"},
            {
                "role": "assistant",
                "content": "A haiku is a short Japanese poem with three lines of five, seven and five syllables.",
            },
            {"role": "user", "content": "Write one about rain."},
        ],
    },
    {"id": "3", "messages": [{"role": "user", "content": "Translate 'good morning' into Portuguese."}]},
    {"id": "sharegpt-3", "messages": [{"role": "user", "content": "Name three prime numbers."}]},
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", ["sharegpt.json", "sharegpt.jsonl"])
def test_conversations_end_at_the_last_human_turn(tmp_path, capsys, name):
    out = tmp_path / "out.jsonl"
    rc = main(["prompts", "convert", "--from", "sharegpt", str(FIXTURES / name), str(out)])
    assert rc == 0
    assert capsys.readouterr().out == f"converted 3 conversations to {out}; skipped 2 with no human turn\n"
    assert read_jsonl(out) == EXPECTED
    # The output is a valid corpus.
    assert [r.id for r in load_corpus(out).requests] == ["sg-1", "3", "sharegpt-3"]


def test_max_tokens_from_the_following_reply(tmp_path):
    out = tmp_path / "out.jsonl"
    result = convert_sharegpt(FIXTURES / "sharegpt.json", out, max_tokens_from_reply=True)
    assert (result.converted, result.skipped_no_human) == (3, 2)
    rows = read_jsonl(out)
    # "Soft rain on the roof, / ..." is 78 UTF-8 bytes -> 20 tokens; "2, 3 and 5." is 11 -> 3.
    assert [r.get("max_tokens") for r in rows] == [20, None, 3]


def test_nothing_converted_is_an_error_and_writes_nothing(tmp_path):
    src = tmp_path / "bots.json"
    src.write_text(json.dumps([{"id": "x", "conversations": [{"from": "gpt", "value": "hi"}]}]), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    with pytest.raises(CorpusError) as info:
        convert_sharegpt(src, out)
    assert str(info.value) == f"{src}: no conversation has a human turn (1 skipped); nothing to write to {out}"
    assert list(tmp_path.iterdir()) == [src]


def test_a_failed_conversion_leaves_the_old_output_in_place(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("old\n", encoding="utf-8")
    src = tmp_path / "bad.jsonl"
    src.write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n{"conversations": [{"from": "alien"}]}\n')
    with pytest.raises(CorpusError):
        convert_sharegpt(src, out)
    assert out.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "out.jsonl"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['"hi"'], "1: expected a conversation object, found a string"),
        (['{"id": "a"}'], "1: no turns; a conversation needs one of the keys conversations, conversation, messages"),
        (['{"conversations": "hi"}'], "1: 'conversations' is a string; it must be a list of turns"),
        (
            ['{"conversations": ["hi"]}'],
            '1: conversations[0] is a string; a turn is an object like {"from": "human", "value": "..."}',
        ),
        (
            ["", '{"conversations": [{"from": "alien", "value": "hi"}]}'],
            "2: conversations[0] has speaker 'alien'; valid speakers ('from' or 'role'): human, user, gpt,"
            " assistant, chatgpt, bard, bing, model, system",
        ),
        (
            ['{"conversations": [{"from": "human"}]}'],
            "1: conversations[0] has no text; a turn needs a string 'value' (or 'content')",
        ),
        (['{"conversations": [}'], "1: invalid JSON at column 20: Expecting value"),
    ],
)
def test_bad_jsonl_conversations_name_the_line(tmp_path, lines, message):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError) as info:
        convert_sharegpt(src, tmp_path / "out.jsonl")
    assert str(info.value) == f"{src}:{message}"


def test_bad_item_in_a_json_list_is_named_by_index(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}, {"turns": []}]), encoding="utf-8")
    with pytest.raises(CorpusError) as info:
        convert_sharegpt(src, tmp_path / "out.jsonl")
    assert str(info.value) == (
        f"{src}: item 1: no turns; a conversation needs one of the keys conversations, conversation, messages"
    )


def test_cli_prints_one_line_for_a_missing_input(tmp_path, capsys):
    src = tmp_path / "missing.json"
    rc = main(["prompts", "convert", "--from", "sharegpt", str(src), str(tmp_path / "out.jsonl")])
    assert rc == 2
    assert capsys.readouterr().err == (
        f"planner prompts: error: {src}: cannot read the ShareGPT file: No such file or directory\n"
    )
