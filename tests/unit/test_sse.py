from __future__ import annotations

import json

import pytest

from replay.client.sse import DONE, SSEParser

VLLM_STREAM = (
    'data: {"id":"cmpl-1","choices":[{"index":0,"text":" h\u00e9llo \u4e16\u754c","finish_reason":null}]}\n\n'
    'data: {"id":"cmpl-1","choices":[{"index":0,"text":" \U0001f600","finish_reason":"length"}]}\n\n'
    'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}\n\n'
    "data: [DONE]\n\n"
).encode()


def feed_all(parts: list[bytes]) -> list[str]:
    parser = SSEParser()
    out: list[str] = []
    for part in parts:
        out += parser.feed(part)
    return out


def test_whole_stream_in_one_read() -> None:
    events = feed_all([VLLM_STREAM])
    assert events[-1] == DONE
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["text"] == " h\u00e9llo \u4e16\u754c"
    assert chunks[1]["choices"][0]["text"] == " \U0001f600"
    assert chunks[2]["choices"] == [] and chunks[2]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_split_at_every_byte_offset_gives_the_same_events(newline: str) -> None:
    stream = VLLM_STREAM.decode().replace("\n", newline).encode()
    expected = feed_all([stream])
    assert len(expected) == 4
    # Two cuts at every pair of offsets would be slow; one cut everywhere plus byte-by-byte
    # covers splits inside multi-byte characters, inside CRLF and between the two newlines.
    for cut in range(len(stream) + 1):
        assert feed_all([stream[:cut], stream[cut:]]) == expected, f"cut at byte {cut}"
    assert feed_all([stream[i : i + 1] for i in range(len(stream))]) == expected


def test_crlf_split_between_cr_and_lf_does_not_end_an_extra_line() -> None:
    parser = SSEParser()
    # "data: a\r" | "\ndata: b\r\n\r\n": the CR+LF is one line end, so both lines belong to one event.
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\ndata: b\r\n\r\n") == ["a\nb"]


def test_multi_line_data_comments_and_other_fields() -> None:
    stream = b": keep-alive comment\nevent: message\nid: 7\nretry: 100\ndata: one\ndata:two\ndata\n\n"
    assert feed_all([stream]) == ["one\ntwo\n"]


def test_event_without_data_and_empty_data_are_not_dispatched() -> None:
    assert feed_all([b": ping\n\n", b"event: x\n\n", b"data: \n\n", b"data:\n\n"]) == []


def test_field_that_only_starts_with_data_is_ignored() -> None:
    assert feed_all([b"database: x\ndata: y\n\n"]) == ["y"]


def test_unfinished_event_at_end_is_held_back() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n') == []
    assert parser.feed(b"data: [DO") == []
    assert parser.feed(b"NE]\n\n") == ['{"a": 1}\n[DONE]']


def test_error_event_inside_a_stream() -> None:
    err = {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
    events = feed_all([f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()])
    assert json.loads(events[0]) == err and events[1] == DONE


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert feed_all([b"data: \xff\xfe\n\n"]) == ["\ufffd\ufffd"]


def test_fast_path_and_general_path_agree_on_many_events() -> None:
    events = [f'data: {{"i": {i}}}\n\n'.encode() for i in range(50)]
    one_by_one = feed_all(events)
    coalesced = feed_all([b"".join(events)])
    assert one_by_one == coalesced == [f'{{"i": {i}}}' for i in range(50)]
