"""OpenAI-style chat logs (JSONL, one logged request a line: `{"messages": [...]}`) grouped into
sessions.

A chat client resends the whole conversation at every turn, so a log line whose messages begin
with an earlier line's messages followed by an assistant message is that conversation's next
turn: the assistant message is the recorded reply to the earlier turn, and what follows it is the
new turn. Every other line starts a session. The output is the corpus's turn-line form
(replay.corpus.jsonl): `session_id`, `turn`, the turn's new `messages`, the recorded `assistant` reply
when a later line shows it (with `max_tokens` estimated from it unless the line has its own), and
the first turn's `timestamp_s` when the log has one.

Messages are matched by hashing each prefix in a chain (each hash covers the one before and the
next message), so a 100k-line log groups in one pass.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.atomic import atomic_text
from replay.corpus.jsonl import ROLES, check_messages, json_kind
from replay.corpus.lengths import estimate_tokens
from replay.errors import CorpusError


@dataclass
class _Session:
    id: str
    turns: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class GroupResult:
    lines: int
    sessions: int
    turns: int


def _chain(messages: list[dict]) -> list[bytes]:
    """hashes[k]: the hash of messages[:k + 1]."""
    out = []
    h = b""
    for m in messages:
        h = hashlib.sha256(h + json.dumps([m["role"], m["content"]], ensure_ascii=False).encode("utf-8")).digest()
        out.append(h)
    return out


def group_chat_log(src: Path, dst: Path) -> GroupResult:
    """Write the sessions of a chat log as turn lines; OUT appears whole or not at all."""
    path = str(src)
    sessions: list[_Session] = []
    # The hash of the messages a session's last turn sent -> that session.
    open_ends: dict[bytes, _Session] = {}
    lines = 0
    try:
        f = open(src, encoding="utf-8")
    except OSError as exc:
        raise CorpusError(f"cannot read the chat log: {exc.strerror or exc}", path=path) from exc
    with f:
        for lineno, text in enumerate(f, start=1):
            if not text.strip():
                continue

            def bad(message: str, lineno: int = lineno) -> CorpusError:
                return CorpusError(message, path=path, line=lineno)

            obj, messages, max_tokens = _logged_request(text, bad)
            lines += 1
            chain = _chain(messages)
            # The longest earlier conversation this line continues: its messages, then a reply.
            session = start = None
            for k in range(len(messages) - 2, 0, -1):
                if messages[k]["role"] == "assistant" and chain[k - 1] in open_ends:
                    session = open_ends.pop(chain[k - 1])
                    start = k
                    break
            turn: dict[str, Any]
            if session is None:
                session = _Session(f"chat-{len(sessions) + 1}")
                sessions.append(session)
                turn = {"messages": messages}
                if isinstance(obj.get("timestamp_s"), int | float) and not isinstance(obj.get("timestamp_s"), bool):
                    turn["timestamp_s"] = obj["timestamp_s"]
            else:
                assert start is not None
                previous = session.turns[-1]
                reply = messages[start]["content"]
                previous["assistant"] = reply
                if "max_tokens" not in previous and reply:
                    previous["max_tokens"] = estimate_tokens(reply)
                turn = {"messages": messages[start + 1 :]}
            if max_tokens is not None:
                turn["max_tokens"] = max_tokens
            session.turns.append(turn)
            open_ends[chain[-1]] = session
    if not sessions:
        raise CorpusError("the chat log has no requests", path=path)
    return GroupResult(lines=lines, sessions=len(sessions), turns=_write_sessions(dst, sessions))


def _logged_request(text: str, bad) -> tuple[dict, list[dict], int | None]:
    """One logged chat request: the line's object, its messages (ending with what was sent), and
    its max_tokens."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"invalid JSON at column {exc.colno}: {exc.msg}") from None
    if not isinstance(obj, dict) or "messages" not in obj:
        raise bad(f"expected an object with 'messages' (a logged chat request), found {json_kind(obj)}")
    messages = check_messages(obj["messages"], bad)
    if messages[-1]["role"] == "assistant":
        raise bad(f"the last message is the assistant's; a logged request ends with what was sent ({', '.join(r for r in ROLES if r != 'assistant')})")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad(f"field 'max_tokens' is {json_kind(max_tokens)}; it must be an integer >= 1")
    return obj, messages, max_tokens


def _write_sessions(dst: Path, sessions: list[_Session]) -> int:
    """The sessions as turn lines, atomically; returns how many turns."""
    turns = 0
    try:
        with atomic_text(dst, newline="\n") as out:
            for s in sessions:
                for n, t in enumerate(s.turns, start=1):
                    turns += 1
                    out.write(json.dumps({"session_id": s.id, "turn": n, **t}, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise CorpusError(f"cannot write the grouped corpus: {exc.strerror or exc}", path=str(dst)) from exc
    return turns
