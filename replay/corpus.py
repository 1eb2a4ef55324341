"""The prompt corpus: a JSONL file, one request per line, validated as it streams in.

A line is a JSON object with exactly one of

    {"prompt": "text"}                                         a completions-style request
    {"messages": [{"role": "user", "content": "text"}, ...]}   a chat request

and optionally `max_tokens` (integer >= 1), `id` (string or integer; defaults to "line-N") and
`timestamp_s` (arrival offset in seconds, number >= 0, used by trace replay). Any other field
(`category`, ...) is kept in `CorpusRequest.extra`. Blank lines are ignored.

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


@dataclass
class Corpus:
    path: str
    sha256: str
    requests: list[CorpusRequest]
    skipped_invalid: int = 0
    # The first few skip messages (file:line: why), for the user to see; skipped_invalid counts all.
    skipped_samples: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def has_timestamps(self) -> bool:
        """True when every request carries timestamp_s, so the corpus can be replayed as a trace."""
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
                req = _parse_line(raw, lineno, len(requests), path_s)
            except CorpusError as exc:
                if not skip_invalid:
                    raise
                skipped += 1
                if len(samples) < SKIP_SAMPLES:
                    samples.append(str(exc))
                continue
            requests.append(req)
    if not requests:
        if skipped:
            raise CorpusError(
                f"the corpus has no valid requests: all {skipped} non-blank lines were skipped as invalid"
                f" (first: {samples[0]})",
                path=path_s,
            )
        raise CorpusError("the corpus has no requests (the file is empty or holds only blank lines)", path=path_s)
    return Corpus(
        path=path_s, sha256=digest.hexdigest(), requests=requests, skipped_invalid=skipped, skipped_samples=samples
    )


def _parse_line(raw: bytes, lineno: int, index: int, path: str) -> CorpusRequest:
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
            f"expected a JSON object like {{\"prompt\": \"...\"}} or {{\"messages\": [...]}}, found {_kind(obj)}"
        )

    has_prompt = "prompt" in obj
    has_messages = "messages" in obj
    if has_prompt and has_messages:
        raise bad("has both 'prompt' and 'messages'; a request has exactly one of them")
    if not has_prompt and not has_messages:
        raise bad("has neither 'prompt' nor 'messages'; a request has exactly one of them")

    prompt: str | None = None
    messages: list[dict] | None = None
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise bad(f"field 'prompt' is {_kind(prompt)}; it must be a non-empty string")
        if not prompt:
            raise bad("field 'prompt' is an empty string; it must be a non-empty string")
    else:
        messages = _check_messages(obj["messages"], bad)

    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise bad(f"field 'max_tokens' is {_kind(max_tokens)}; it must be an integer >= 1")

    raw_id = obj.get("id")
    if raw_id is None:
        req_id = f"line-{lineno}"
    elif isinstance(raw_id, str):
        req_id = raw_id
    elif isinstance(raw_id, int) and not isinstance(raw_id, bool):
        req_id = str(raw_id)
    else:
        raise bad(f"field 'id' is {_kind(raw_id)}; it must be a string or an integer")

    timestamp_s = obj.get("timestamp_s")
    if timestamp_s is not None:
        if (
            isinstance(timestamp_s, bool)
            or not isinstance(timestamp_s, int | float)
            or not math.isfinite(timestamp_s)
            or timestamp_s < 0
        ):
            raise bad(f"field 'timestamp_s' is {_kind(timestamp_s)}; it must be a number >= 0 (seconds)")
        timestamp_s = float(timestamp_s)

    extra = {k: v for k, v in obj.items() if k not in KNOWN_FIELDS}
    return CorpusRequest(
        index=index,
        line=lineno,
        id=req_id,
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        timestamp_s=timestamp_s,
        extra=extra,
    )


def _check_messages(messages: Any, bad) -> list[dict]:
    if not isinstance(messages, list):
        raise bad(f"field 'messages' is {_kind(messages)}; it must be a non-empty list of {{role, content}} objects")
    if not messages:
        raise bad("field 'messages' is an empty list; it must hold at least one {role, content} object")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad(f"{where} is {_kind(msg)}; each message must be an object with 'role' and 'content'")
        if "role" not in msg:
            raise bad(f"{where} has no 'role'; each message needs 'role' (one of {', '.join(ROLES)})")
        if "content" not in msg:
            raise bad(f"{where} has no 'content'; each message needs 'content' (a string)")
        role = msg["role"]
        if role not in ROLES:
            shown = repr(role) if isinstance(role, str) else _kind(role)
            raise bad(f"{where} has unknown role {shown}; valid roles: {', '.join(ROLES)}")
        if not isinstance(msg["content"], str):
            raise bad(f"{where} field 'content' is {_kind(msg['content'])}; it must be a string")
    return messages


def _kind(value: Any) -> str:
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
