"""replay.corpus.jsonl: every validation error names file:line and what is valid; skips are counted."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path

import pytest

from replay.corpus.jsonl import SKIP_SAMPLES, CorpusRequest, load_corpus, request_text
from replay.errors import CorpusError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
GOOD_LINE = '{"prompt": "Hello there"}'


def write(tmp_path: Path, *lines: str, name: str = "c.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_good_fixture_loads_every_field():
    corpus = load_corpus(FIXTURES / "good.jsonl")
    assert len(corpus) == 5
    first, second, third, fourth, fifth = corpus.requests
    assert first == CorpusRequest(
        index=0,
        line=1,
        id="chat-1",
        prompt=None,
        messages=[{"role": "system", "content": "You are brief."}, {"role": "user", "content": "How should I boil an egg?"}],
        max_tokens=16,
        timestamp_s=0.0,
        extra={"category": "chat"},
    )
    assert second.id == "2"  # integer ids become strings
    # The blank line after line 3 is skipped silently, and line numbers stay physical.
    assert (third.index, third.line, fourth.index, fourth.line) == (2, 3, 3, 5)
    assert fifth.id == "line-6" and fifth.max_tokens is None and fifth.extra == {}
    assert corpus.has_timestamps
    assert corpus.skipped_invalid == 0 and corpus.skipped_samples == []


def test_sha256_is_of_the_file_bytes():
    path = FIXTURES / "good.jsonl"
    assert load_corpus(path).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_unknown_fields_are_kept_in_extra(tmp_path):
    path = write(tmp_path, '{"prompt": "hi", "category": "chat", "tenant": {"name": "acme"}, "priority": 3}')
    req = load_corpus(path).requests[0]
    assert req.extra == {"category": "chat", "tenant": {"name": "acme"}, "priority": 3}


def test_has_timestamps_needs_every_request(tmp_path):
    path = write(tmp_path, '{"prompt": "a", "timestamp_s": 0}', '{"prompt": "b"}')
    corpus = load_corpus(path)
    assert not corpus.has_timestamps
    assert corpus.requests[0].timestamp_s == 0.0 and isinstance(corpus.requests[0].timestamp_s, float)


def test_crlf_line_endings_are_accepted(tmp_path):
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b'{"prompt": "a"}\r\n\r\n{"prompt": "b"}\r\n')
    assert [r.prompt for r in load_corpus(path).requests] == ["a", "b"]


def test_request_text_joins_message_contents():
    corpus = load_corpus(FIXTURES / "good.jsonl")
    assert request_text(corpus.requests[0]) == "You are brief.\nHow should I boil an egg?"
    assert request_text(corpus.requests[2]).startswith("Explain this Python function:")


def test_requests_are_lean():
    # slots: no per-instance __dict__ on 100k objects.
    assert not hasattr(load_corpus(FIXTURES / "good.jsonl").requests[0], "__dict__")


BAD_LINES = [
    ('{"prompt": "hi"', "invalid JSON at column 16: Expecting ',' delimiter"),
    ("prompt: hi", "invalid JSON at column 1: Expecting value"),
    ('["a", "b"]', 'expected a JSON object like {"prompt": "..."} or {"messages": [...]}, found a list'),
    ('"just text"', 'expected a JSON object like {"prompt": "..."} or {"messages": [...]}, found a string ("just text")'),
    ('{"max_tokens": 5}', "has neither 'prompt' nor 'messages'; a request has exactly one of them"),
    (
        '{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
        "has both 'prompt' and 'messages'; a request has exactly one of them",
    ),
    ('{"prompt": 42}', "field 'prompt' is an integer (42); it must be a non-empty string"),
    ('{"prompt": ""}', "field 'prompt' is an empty string; it must be a non-empty string"),
    ('{"prompt": null}', "field 'prompt' is null; it must be a non-empty string"),
    (
        '{"messages": "hello"}',
        "field 'messages' is a string (\"hello\"); it must be a non-empty list of {role, content} objects",
    ),
    ('{"messages": []}', "field 'messages' is an empty list; it must hold at least one {role, content} object"),
    ('{"messages": ["hi"]}', "messages[0] is a string (\"hi\"); each message must be an object with 'role' and 'content'"),
    (
        '{"messages": [{"content": "hi"}]}',
        "messages[0] has no 'role'; each message needs 'role' (one of system, user, assistant, tool, developer)",
    ),
    (
        '{"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}',
        "messages[1] has no 'content'; each message needs 'content' (a string)",
    ),
    (
        '{"messages": [{"role": "human", "content": "hi"}]}',
        "messages[0] has unknown role 'human'; valid roles: system, user, assistant, tool, developer",
    ),
    (
        '{"messages": [{"role": 1, "content": "hi"}]}',
        "messages[0] has unknown role an integer (1); valid roles: system, user, assistant, tool, developer",
    ),
    (
        '{"messages": [{"role": "user", "content": ["hi"]}]}',
        "messages[0] field 'content' is a list; it must be a string",
    ),
    ('{"prompt": "a", "max_tokens": 0}', "field 'max_tokens' is an integer (0); it must be an integer >= 1"),
    ('{"prompt": "a", "max_tokens": 12.5}', "field 'max_tokens' is a number (12.5); it must be an integer >= 1"),
    ('{"prompt": "a", "max_tokens": "64"}', "field 'max_tokens' is a string (\"64\"); it must be an integer >= 1"),
    ('{"prompt": "a", "max_tokens": true}', "field 'max_tokens' is a boolean (true); it must be an integer >= 1"),
    ('{"prompt": "a", "id": 1.5}', "field 'id' is a number (1.5); it must be a string or an integer"),
    ('{"prompt": "a", "id": [1]}', "field 'id' is a list; it must be a string or an integer"),
    (
        '{"prompt": "a", "timestamp_s": -1}',
        "field 'timestamp_s' is an integer (-1); it must be a number >= 0 (seconds)",
    ),
    (
        '{"prompt": "a", "timestamp_s": "0.5"}',
        "field 'timestamp_s' is a string (\"0.5\"); it must be a number >= 0 (seconds)",
    ),
    (
        '{"prompt": "a", "timestamp_s": NaN}',
        "field 'timestamp_s' is a number (nan); it must be a number >= 0 (seconds)",
    ),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[m.split(";")[0][:40] for _, m in BAD_LINES])
def test_each_invalid_line_is_named_by_file_and_line(tmp_path, line, message):
    path = write(tmp_path, GOOD_LINE, "", line, GOOD_LINE)
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value) == f"{path}:3: {message}"
    assert (info.value.path, info.value.line) == (str(path), 3)


def test_invalid_utf8_is_named_by_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD_LINE.encode() + b'\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value) == f"{path}:2: not valid UTF-8 at byte 16 of the line; a corpus must be UTF-8 encoded"


def test_long_string_values_are_shortened_in_messages(tmp_path):
    path = write(tmp_path, json.dumps({"prompt": "a", "max_tokens": "x" * 100}))
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value) == f'{path}:1: field \'max_tokens\' is a string ("{"x" * 37}..."); it must be an integer >= 1'


def test_empty_file_says_it_has_no_requests(tmp_path):
    path = write(tmp_path, "", "   ")
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value) == f"{path}: the corpus has no requests (the file is empty or holds only blank lines)"
    assert info.value.line is None


def test_missing_file_is_a_corpus_error(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value) == f"{path}: cannot read the corpus: No such file or directory"


def test_skip_invalid_counts_and_samples(tmp_path):
    corpus = load_corpus(FIXTURES / "mixed.jsonl", skip_invalid=True)
    path = str(FIXTURES / "mixed.jsonl")
    assert [r.line for r in corpus.requests] == [1, 5, 7]
    assert [r.index for r in corpus.requests] == [0, 1, 2]
    assert corpus.requests[2].id == "7" and corpus.requests[2].extra == {"source": "web"}
    assert corpus.skipped_invalid == 4
    assert corpus.skipped_samples == [
        f"{path}:2: invalid JSON at column 27: Expecting ',' delimiter",
        f'{path}:3: expected a JSON object like {{"prompt": "..."}} or {{"messages": [...]}}, found a list',
        f"{path}:4: field 'max_tokens' is an integer (0); it must be an integer >= 1",
        f"{path}:6: has neither 'prompt' nor 'messages'; a request has exactly one of them",
    ]


def test_without_skip_invalid_the_first_bad_line_is_fatal():
    with pytest.raises(CorpusError, match=r"mixed\.jsonl:2: invalid JSON"):
        load_corpus(FIXTURES / "mixed.jsonl")


def test_skip_samples_are_capped_but_the_count_is_not(tmp_path):
    path = write(tmp_path, *(["{}"] * (SKIP_SAMPLES + 3)), GOOD_LINE)
    corpus = load_corpus(path, skip_invalid=True)
    assert corpus.skipped_invalid == SKIP_SAMPLES + 3
    assert len(corpus.skipped_samples) == SKIP_SAMPLES
    assert len(corpus) == 1


def test_everything_skipped_says_how_many(tmp_path):
    path = write(tmp_path, "{}", "[]", "")
    with pytest.raises(CorpusError) as info:
        load_corpus(path, skip_invalid=True)
    assert str(info.value) == (
        f"{path}: the corpus has no valid requests: all 2 non-blank lines were skipped as invalid"
        f" (first: {path}:1: has neither 'prompt' nor 'messages'; a request has exactly one of them)"
    )


@pytest.mark.timeout(60)
def test_100k_lines_load_without_holding_the_file_twice(tmp_path):
    path = tmp_path / "big.jsonl"
    filler = "Explain how the billing service retries a failed payment and what the customer sees. " * 3
    with path.open("w", encoding="utf-8") as f:
        for i in range(100_000):
            if i % 2:
                f.write(json.dumps({"id": i, "prompt": f"{i}: {filler}", "max_tokens": 128, "category": "rag"}) + "\n")
            else:
                msgs = [{"role": "user", "content": f"{i}: {filler}"}]
                f.write(json.dumps({"messages": msgs, "timestamp_s": i * 0.2}) + "\n")
    file_bytes = path.stat().st_size

    tracemalloc.start()
    try:
        corpus = load_corpus(path)
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert len(corpus) == 100_000
    assert corpus.requests[-1].line == 100_000
    # Streaming keeps the peak at the parsed objects plus one line in flight. Reading the whole
    # file first (f.read() or readlines()) would add the file's size again: well over 20 %.
    assert peak < 1.2 * retained, (peak, retained)
    assert peak - retained < 0.1 * file_bytes, (peak, retained, file_bytes)
