"""The prompt corpus: a JSONL file, one request per line, validated as it streams in.

A line is a JSON object with exactly one of

    {"prompt": "text"}                                         a completions-style request
    {"messages": [{"role": "user", "content": "text"}, ...]}   a chat request

and optionally `max_tokens` (integer >= 1), `id` (string or integer; defaults to "line-N") and
`timestamp_s` (arrival offset in seconds, number >= 0, used by trace replay). Any other field
(`category`, ...) is kept in `CorpusRequest.extra`. Blank lines are ignored.

Sessions (conversations replayed turn by turn, each turn resending the history) come in two
forms, which a corpus may not mix with each other or with plain requests:

    {"session_id": "s1", "turn": 1, "messages": [...], "think_time_s": 2.5, "assistant": "..."}
        one turn a line: `turn` counts 1, 2, ... in file order within its session; `prompt` or
        `messages` hold only what is new at this turn (the replay prepends the history);
        `assistant` is the recorded reply (sent as history instead of the streamed one).
    {"id": "s1", "system": "...", "conversation": [{"user": "...", "max_tokens": 64,
        "assistant": "...", "think_time_s": 2.5}, ...]}
        a whole session on one line.

`think_time_s` (number >= 0) is the time the user reads before sending a turn (not on turn 1);
`timestamp_s` on a session is its first turn's arrival.

Corpora of production size (100k lines and more) are read line by line: the file's bytes are
hashed as they pass and no raw line outlives its own parse.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

from replay.errors import CorpusError

ROLES = ("system", "user", "assistant", "tool", "developer")
KNOWN_FIELDS = frozenset({"prompt", "messages", "max_tokens", "id", "timestamp_s"})
SESSION_FIELDS = frozenset({"session_id", "turn", "think_time_s", "assistant"})
CONVERSATION_FIELDS = frozenset({"id", "conversation", "system", "timestamp_s"})
TURN_FIELDS = frozenset({"user", "max_tokens", "assistant", "think_time_s"})
# How many skip messages a Corpus keeps to show the user; the count covers the rest.
SKIP_SAMPLES = 5


@dataclass(slots=True)
class CorpusRequest:
    index: int
    line: int
    id: str
    prompt: str | None
    messages: list[dict] | None
    max_tokens: int | None
    timestamp_s: float | None
    extra: dict
    # Sessions only: the session, the turn number (1, 2, ...), the user's reading time before
    # this turn, and the recorded assistant reply to it.
    session_id: str | None = None
    turn: int | None = None
    think_time_s: float | None = None
    assistant: str | None = None


@dataclass
class Session:
    """One conversation: its turns in order (turn 1 first)."""

    id: str
    turns: list[CorpusRequest]

    @property
    def timestamp_s(self) -> float | None:
        return self.turns[0].timestamp_s


@dataclass
class Corpus:
    path: str
    sha256: str
    requests: list[CorpusRequest]
    skipped_invalid: int = 0
    # The first few skip messages (file:line: why), for the user to see; skipped_invalid counts all.
    skipped_samples: list[str] = field(default_factory=list)

    # Session corpora: the conversations in order of their first turn (None: plain requests).
    sessions: list[Session] | None = None

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def has_timestamps(self) -> bool:
        """True when every request (every session's first turn) carries timestamp_s, so the
        corpus can be replayed as a trace."""
        if self.sessions is not None:
            return all(s.timestamp_s is not None for s in self.sessions)
        return bool(self.requests) and all(r.timestamp_s is not None for r in self.requests)


def request_text(req: CorpusRequest) -> str:
    """The text a tokenizer would see, before any chat template: the prompt, or the contents joined."""
    if req.prompt is not None:
        return req.prompt
    return "\n".join(m["content"] for m in req.messages or ())


def load_corpus(path: str | PathLike[str], *, skip_invalid: bool = False) -> Corpus:
    """Read and validate a JSONL corpus. With skip_invalid, bad lines are counted instead of fatal."""
    path_s = str(path)
    digest = hashlib.sha256()
    requests: list[CorpusRequest] = []
    sessions = _Sessions(path_s)
    skipped = 0
    samples: list[str] = []
    try:
        f = open(path_s, "rb")
    except OSError as exc:
        raise CorpusError(f"cannot read the corpus: {exc.strerror or exc}", path=path_s) from exc
    with f:
        # Binary lines: the hash sees the exact bytes, and a bad UTF-8 sequence is blamed on its line.
        for lineno, raw in enumerate(f, start=1):
            digest.update(raw)
            if not raw.strip():
                continue
            try:
                parsed = sessions.add(_parse_line(raw, lineno, len(requests), path_s), lineno)
            except CorpusError as exc:
                if not skip_invalid:
                    raise
                skipped += 1
                if len(samples) < SKIP_SAMPLES:
                    samples.append(str(exc))
                continue
            requests.extend(parsed)
    if not requests:
        if skipped:
            raise CorpusError(
                f"the corpus has no valid requests: all {skipped} non-blank lines were skipped as invalid"
                f" (first: {samples[0]})",
                path=path_s,
            )
        raise CorpusError("the corpus has no requests (the file is empty or holds only blank lines)", path=path_s)
    return Corpus(
        path=path_s,
        sha256=digest.hexdigest(),
        requests=requests,
        skipped_invalid=skipped,
        skipped_samples=samples,
        sessions=sessions.in_order(),
    )


class _Sessions:
    """Checks, line by line, that sessions are well formed and gathers their turns: forms not
    mixed, turns numbered 1, 2, ... in file order, each session given once."""

    def __init__(self, path: str) -> None:
        self.path = path
        # The form of the first line ("plain", "turns" or "conversation") and its line number.
        self.form: tuple[str, int] | None = None
        self.by_id: dict[str, Session] = {}
        self.first_line: dict[str, int] = {}
        self.turn_lines: dict[tuple[str, int], int] = {}

    def add(self, parsed: CorpusRequest | list[CorpusRequest], lineno: int) -> list[CorpusRequest]:
        """The line's requests, once the line fits the corpus so far (else a CorpusError)."""
        turns = parsed if isinstance(parsed, list) else [parsed]
        form = "conversation" if isinstance(parsed, list) else ("turns" if parsed.session_id is not None else "plain")
        if self.form is None:
            self.form = (form, lineno)
        elif self.form[0] != form:
            raise CorpusError(
                f"a {_FORM_NAMES[form]} in a corpus whose line {self.form[1]} is a {_FORM_NAMES[self.form[0]]};"
                " a corpus holds plain requests, session turns (session_id and turn), or whole conversations"
                " (conversation), not a mix",
                path=self.path,
                line=lineno,
            )
        if form == "plain":
            return turns
        sid = turns[0].session_id
        assert sid is not None
        session = self.by_id.get(sid)
        if form == "conversation":
            if session is not None:
                raise CorpusError(
                    f"session {sid!r} again (first at line {self.first_line[sid]}); each conversation has one line",
                    path=self.path,
                    line=lineno,
                )
            self.by_id[sid] = Session(sid, list(turns))
            self.first_line[sid] = lineno
            return turns
        turn = turns[0]
        assert turn.turn is not None
        seen = len(session.turns) if session is not None else 0
        if (sid, turn.turn) in self.turn_lines:
            raise CorpusError(
                f"turn {turn.turn} of session {sid!r} again (first at line {self.turn_lines[(sid, turn.turn)]});"
                " each turn of a session appears once",
                path=self.path,
                line=lineno,
            )
        if turn.turn != seen + 1:
            earlier = f"only its turns 1-{seen} come before it" if seen else "none of its earlier turns comes before it"
            raise CorpusError(
                f"turn {turn.turn} of session {sid!r}, but {earlier}; a session's turns are numbered 1, 2, ..."
                " and appear in that order in the file",
                path=self.path,
                line=lineno,
            )
        if turn.turn > 1 and turn.timestamp_s is not None:
            raise CorpusError(
                f"'timestamp_s' on turn {turn.turn} of session {sid!r}; only a session's first turn has an arrival"
                " time (later turns follow the previous answer after think_time_s)",
                path=self.path,
                line=lineno,
            )
        if session is None:
            session = self.by_id[sid] = Session(sid, [])
            self.first_line[sid] = lineno
        session.turns.append(turn)
        self.turn_lines[(sid, turn.turn)] = lineno
        return turns

    def in_order(self) -> list[Session] | None:
        if self.form is None or self.form[0] == "plain":
            return None
        return list(self.by_id.values())


_FORM_NAMES = {"plain": "plain request", "turns": "session turn", "conversation": "conversation"}


def _prompt_or_messages(obj: dict, bad) -> tuple[str | None, list[dict] | None]:
    """A request's text: exactly one of a non-empty 'prompt' and valid 'messages'."""
    has_prompt = "prompt" in obj
    has_messages = "messages" in obj
    if has_prompt and has_messages:
        raise bad("has both 'prompt' and 'messages'; a request has exactly one of them")
    if not has_prompt and not has_messages:
        raise bad("has neither 'prompt' nor 'messages'; a request has exactly one of them")
    if not has_prompt:
        return None, check_messages(obj["messages"], bad)
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        raise bad(f"field 'prompt' is {json_kind(prompt)}; it must be a non-empty string")
    if not prompt:
        raise bad("field 'prompt' is an empty string; it must be a non-empty string")
    return prompt, None


def _max_tokens(max_tokens: Any, bad) -> int | None:
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise bad(f"field 'max_tokens' is {json_kind(max_tokens)}; it must be an integer >= 1")
    return max_tokens


def _request_id(raw_id: Any, lineno: int, bad) -> str:
    if raw_id is None:
        return f"line-{lineno}"
    if isinstance(raw_id, str):
        return raw_id
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        return str(raw_id)
    raise bad(f"field 'id' is {json_kind(raw_id)}; it must be a string or an integer")


def _timestamp(timestamp_s: Any, bad) -> float | None:
    if timestamp_s is None:
        return None
    if (
        isinstance(timestamp_s, bool)
        or not isinstance(timestamp_s, int | float)
        or not math.isfinite(timestamp_s)
        or timestamp_s < 0
    ):
        raise bad(f"field 'timestamp_s' is {json_kind(timestamp_s)}; it must be a number >= 0 (seconds)")
    return float(timestamp_s)


def _parse_line(raw: bytes, lineno: int, index: int, path: str) -> CorpusRequest | list[CorpusRequest]:
    def bad(message: str) -> CorpusError:
        return CorpusError(message, path=path, line=lineno)

    try:
        # Without its line ending, so a JSON error's column points into the line, not past it.
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise bad(f"not valid UTF-8 at byte {exc.start + 1} of the line; a corpus must be UTF-8 encoded") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"invalid JSON at column {exc.colno}: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise bad(
            f"expected a JSON object like {{\"prompt\": \"...\"}} or {{\"messages\": [...]}}, found {json_kind(obj)}"
        )
    if "conversation" in obj:
        return _parse_conversation(obj, lineno, index, bad)

    prompt, messages = _prompt_or_messages(obj, bad)
    max_tokens = _max_tokens(obj.get("max_tokens"), bad)
    raw_id = obj.get("id")
    req_id = _request_id(raw_id, lineno, bad)
    timestamp_s = _timestamp(obj.get("timestamp_s"), bad)

    session_id = turn = None
    if "session_id" in obj or "turn" in obj:
        session_id = _session_id(obj.get("session_id"), bad)
        turn = obj.get("turn")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 1:
            raise bad(f"field 'turn' is {json_kind(turn)}; a session's line needs 'turn', an integer >= 1")
    elif "think_time_s" in obj or "assistant" in obj:
        field_name = "think_time_s" if "think_time_s" in obj else "assistant"
        raise bad(f"field {field_name!r} belongs to a session's turn; give the line 'session_id' and 'turn' too")
    think = _think_time(obj.get("think_time_s"), turn or 1, bad)
    assistant = _assistant(obj.get("assistant"), bad)

    extra = {k: v for k, v in obj.items() if k not in KNOWN_FIELDS | SESSION_FIELDS}
    return CorpusRequest(
        index=index,
        line=lineno,
        id=req_id if session_id is None or raw_id is not None else f"{session_id}#{turn}",
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        timestamp_s=timestamp_s,
        extra=extra,
        session_id=session_id,
        turn=turn,
        think_time_s=think,
        assistant=assistant,
    )


def _session_id(raw: Any, bad) -> str:
    if isinstance(raw, str) and raw:
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    raise bad(f"field 'session_id' is {json_kind(raw)}; a session's line needs 'session_id', a non-empty string or an integer")


def _think_time(raw: Any, turn: int, bad, where: str = "field 'think_time_s'") -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
        raise bad(f"{where} is {json_kind(raw)}; it must be a number >= 0 (seconds)")
    if turn == 1:
        raise bad(f"{where} on turn 1; the first turn is sent at the session's arrival, later turns after their think time")
    return float(raw)


def _assistant(raw: Any, bad, where: str = "field 'assistant'") -> str | None:
    if raw is not None and not isinstance(raw, str):
        raise bad(f"{where} is {json_kind(raw)}; it must be a string (the recorded reply)")
    return raw


def _parse_conversation(obj: dict, lineno: int, index: int, bad) -> list[CorpusRequest]:
    """A whole session on one line: {"id", "system"?, "timestamp_s"?, "conversation": [turns]}."""
    unknown = sorted(set(obj) - CONVERSATION_FIELDS)
    if unknown:
        raise bad(
            f"a conversation line has {', '.join(repr(k) for k in unknown)}; its fields are"
            f" {', '.join(sorted(CONVERSATION_FIELDS))} (turns hold user, max_tokens, assistant, think_time_s)"
        )
    sid = _session_id(obj["id"], bad) if "id" in obj else f"line-{lineno}"
    system = obj.get("system")
    if system is not None and not isinstance(system, str):
        raise bad(f"field 'system' is {json_kind(system)}; it must be a string (the system prompt)")
    stamp = obj.get("timestamp_s")
    if stamp is not None and (
        isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp) or stamp < 0
    ):
        raise bad(f"field 'timestamp_s' is {json_kind(stamp)}; it must be a number >= 0 (seconds)")
    turns = obj["conversation"]
    if not isinstance(turns, list) or not turns:
        raise bad(f"field 'conversation' is {json_kind(turns)}; it must be a non-empty list of turns like {{\"user\": \"...\"}}")
    out = []
    for i, t in enumerate(turns):
        where = f"conversation[{i}]"
        if not isinstance(t, dict):
            raise bad(f"{where} is {json_kind(t)}; a turn is an object like {{\"user\": \"...\", \"max_tokens\": 64}}")
        unknown = sorted(set(t) - TURN_FIELDS)
        if unknown:
            raise bad(f"{where} has {', '.join(repr(k) for k in unknown)}; a turn's fields are {', '.join(sorted(TURN_FIELDS))}")
        user = t.get("user")
        if not isinstance(user, str) or not user:
            raise bad(f"{where} field 'user' is {json_kind(user)}; a turn needs 'user', a non-empty string")
        max_tokens = t.get("max_tokens")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
            raise bad(f"{where} field 'max_tokens' is {json_kind(max_tokens)}; it must be an integer >= 1")
        messages = [{"role": "user", "content": user}]
        if i == 0 and system:
            messages.insert(0, {"role": "system", "content": system})
        out.append(
            CorpusRequest(
                index=index + i,
                line=lineno,
                id=f"{sid}#{i + 1}",
                prompt=None,
                messages=messages,
                max_tokens=max_tokens,
                timestamp_s=float(stamp) if i == 0 and stamp is not None else None,
                extra={},
                session_id=sid,
                turn=i + 1,
                think_time_s=_think_time(t.get("think_time_s"), i + 1, bad, f"{where} field 'think_time_s'"),
                assistant=_assistant(t.get("assistant"), bad, f"{where} field 'assistant'"),
            )
        )
    return out


def check_messages(messages: Any, bad) -> list[dict]:
    if not isinstance(messages, list):
        raise bad(f"field 'messages' is {json_kind(messages)}; it must be a non-empty list of {{role, content}} objects")
    if not messages:
        raise bad("field 'messages' is an empty list; it must hold at least one {role, content} object")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad(f"{where} is {json_kind(msg)}; each message must be an object with 'role' and 'content'")
        if "role" not in msg:
            raise bad(f"{where} has no 'role'; each message needs 'role' (one of {', '.join(ROLES)})")
        if "content" not in msg:
            raise bad(f"{where} has no 'content'; each message needs 'content' (a string)")
        role = msg["role"]
        if role not in ROLES:
            shown = repr(role) if isinstance(role, str) else json_kind(role)
            raise bad(f"{where} has unknown role {shown}; valid roles: {', '.join(ROLES)}")
        if not isinstance(msg["content"], str):
            raise bad(f"{where} field 'content' is {json_kind(msg['content'])}; it must be a string")
    return messages


def json_kind(value: Any) -> str:
    """How a JSON value reads in an error message: its JSON type and, for scalars, the value."""
    match value:
        case None:
            return "null"
        case bool():
            return f"a boolean ({json.dumps(value)})"
        case int():
            return f"an integer ({value})"
        case float():
            return f"a number ({value!r})"
        case str():
            shown = value if len(value) <= 40 else value[:37] + "..."
            return f"a string ({json.dumps(shown)})"
        case list():
            return "a list"
        case dict():
            return "an object"
    return type(value).__name__
