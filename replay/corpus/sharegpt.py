"""ShareGPT dumps (a JSON list or JSONL of conversations) as a planner corpus.

As sessions (`convert_sharegpt_sessions`, `planner prompts sharegpt`): one conversation line per
conversation, every human turn a turn, the gpt reply that followed it as the turn's recorded
`assistant` text and its estimated length as `max_tokens`. As single requests
(`convert_sharegpt`, `planner prompts convert --from sharegpt`, `planner prompts sharegpt
--single-request`): one request per conversation, its turns up to the last human one as chat
messages, optionally with max_tokens estimated from the reply that followed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.atomic import atomic_text
from replay.corpus.lengths import estimate_tokens
from replay.errors import CorpusError

# ShareGPT dumps name the speakers in several ways; these are the ones seen in the common sets.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
TURN_KEYS = ("conversations", "conversation", "messages")


@dataclass
class ConvertResult:
    converted: int
    skipped_no_human: int


def _sharegpt_items(path: Path) -> Iterator[tuple[int | None, str, Any]]:
    """(line, label, item) per conversation of a JSON list (line None, label "item N: ") or of JSONL."""
    src = str(path)
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise CorpusError(f"cannot read the ShareGPT file: {exc.strerror or exc}", path=src) from exc
    with f:
        first = ""
        while not first:
            chunk = f.read(1)
            if not chunk:
                break
            first = chunk.strip()
        f.seek(0)
        if first == "[":
            # A JSON list has to be parsed whole; ShareGPT dumps are distributed that way.
            try:
                items = json.load(f)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"invalid JSON at column {exc.colno}: {exc.msg}", path=src, line=exc.lineno) from None
            for i, item in enumerate(items):
                yield None, f"item {i}: ", item
            return
        for lineno, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"invalid JSON at column {exc.colno}: {exc.msg}", path=src, line=lineno) from None
            yield lineno, "", item


def _messages(item: Any, fail) -> list[dict[str, str]]:
    """A ShareGPT conversation's turns as chat messages (speakers mapped to roles)."""
    if not isinstance(item, dict):
        raise fail(f"expected a conversation object, found {_json_kind(item)}")
    key = next((k for k in TURN_KEYS if k in item), None)
    if key is None:
        raise fail(f"no turns; a conversation needs one of the keys {', '.join(TURN_KEYS)}")
    turns = item[key]
    if not isinstance(turns, list):
        raise fail(f"{key!r} is {_json_kind(turns)}; it must be a list of turns")
    messages: list[dict[str, str]] = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise fail(f"{key}[{t}] is {_json_kind(turn)}; a turn is an object like {{\"from\": \"human\", \"value\": \"...\"}}")
        speaker = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise fail(f"{key}[{t}] has speaker {speaker!r}; valid speakers ('from' or 'role'): {', '.join(SHAREGPT_ROLES)}")
        if not isinstance(text, str):
            raise fail(f"{key}[{t}] has no text; a turn needs a string 'value' (or 'content')")
        messages.append({"role": role, "content": text})
    return messages


def _conversation_id(item: dict, index: int) -> str:
    raw_id = item.get("id")
    valid_id = isinstance(raw_id, str | int) and not isinstance(raw_id, bool) and raw_id != ""
    return str(raw_id) if valid_id else f"sharegpt-{index}"


def sharegpt_request(item: Any, index: int, *, max_tokens_from_reply: bool, fail) -> dict[str, Any] | None:
    """One planner request from one ShareGPT conversation; None when it has no human turn.

    fail(message) builds the CorpusError that names the conversation's place in the file.
    """
    messages = _messages(item, fail)
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        return None
    raw_id = item.get("id")
    valid_id = isinstance(raw_id, str | int) and not isinstance(raw_id, bool)
    req: dict[str, Any] = {"id": str(raw_id) if valid_id else f"sharegpt-{index}", "messages": messages[: last_user + 1]}
    if max_tokens_from_reply:
        reply = next((m for m in messages[last_user + 1 :] if m["role"] == "assistant"), None)
        if reply is not None and reply["content"]:
            req["max_tokens"] = estimate_tokens(reply["content"])
    return req


def sharegpt_session(item: Any, index: int, *, fail) -> dict[str, Any] | None:
    """One conversation line (replay.corpus.jsonl's session form) from one ShareGPT conversation;
    None when it has no (non-empty) human turn.

    System turns become `system` (joined); each human turn a turn, the gpt turns up to the next
    human one its recorded reply (joined by a blank line) and their estimated length its
    max_tokens. Replies before the first human turn have no turn to answer and are left out;
    the conversation ends before an empty human turn (a turn needs text).
    """
    messages = _messages(item, fail)
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns: list[dict[str, Any]] = []
    replies: list[str] = []

    def close_turn() -> None:
        if turns and replies:
            reply = "\n\n".join(replies)
            turns[-1]["assistant"] = reply
            if reply:
                turns[-1]["max_tokens"] = estimate_tokens(reply)
        replies.clear()

    for m in messages:
        if m["role"] == "user":
            if not m["content"]:
                break
            close_turn()
            turns.append({"user": m["content"]})
        elif m["role"] == "assistant" and turns:
            replies.append(m["content"])
    close_turn()
    if not turns:
        return None
    line: dict[str, Any] = {"id": _conversation_id(item, index)}
    if system:
        line["system"] = "\n\n".join(system)
    line["conversation"] = turns
    return line


def convert_sharegpt_sessions(src: Path, dst: Path) -> ConvertResult:
    """Write one conversation line per ShareGPT conversation; OUT appears whole or not at all."""
    return _convert(src, dst, lambda item, index, fail: sharegpt_session(item, index, fail=fail))


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def convert_sharegpt(src: Path, dst: Path, *, max_tokens_from_reply: bool = False) -> ConvertResult:
    """Write the planner JSONL for a ShareGPT file; OUT appears whole or not at all."""
    return _convert(
        src, dst, lambda item, index, fail: sharegpt_request(item, index, max_tokens_from_reply=max_tokens_from_reply, fail=fail)
    )


def _convert(src: Path, dst: Path, line_of) -> ConvertResult:
    converted = skipped = 0
    try:
        with atomic_text(dst, newline="\n") as out:
            for index, (line, label, item) in enumerate(_sharegpt_items(src)):

                def fail(message: str, line: int | None = line, label: str = label) -> CorpusError:
                    return CorpusError(label + message, path=str(src), line=line)

                req = line_of(item, index, fail)
                if req is None:
                    skipped += 1
                    continue
                out.write(json.dumps(req, ensure_ascii=False) + "\n")
                converted += 1
            if converted == 0:
                raise CorpusError(
                    f"no conversation has a human turn ({skipped} skipped); nothing to write to {dst}", path=str(src)
                )
    except OSError as exc:
        raise CorpusError(f"cannot write the converted corpus: {exc.strerror or exc}", path=str(dst)) from exc
    return ConvertResult(converted=converted, skipped_no_human=skipped)
