"""An incremental Server-Sent-Events parser for streamed completions.

Bytes go in as the network delivers them, split anywhere: inside a line, inside a UTF-8
multi-byte character, between the CR and LF of a CRLF. Each call returns the data of every event
completed by that call, in order; vLLM's terminator arrives as the data string ``DONE``
("[DONE]"). Follows the WHATWG event-stream rules that matter for a client: LF, CRLF and CR all
end a line; a blank line ends an event; ``data:`` lines (one leading space stripped) are joined
with "\\n"; lines starting with ":" are comments; other fields (event, id, retry) are ignored; an
event with no data is not dispatched; an unfinished event at the end of the stream is dropped.

It sits on the hot path (one call per network read, for every stream of a step at concurrency
1000), so the common read, one whole ``data: ...\\n\\n`` event, takes a fast path.
"""

from __future__ import annotations

DONE = "[DONE]"


class SSEParser:
    __slots__ = ("_buf", "_data", "_skip_lf")

    def __init__(self) -> None:
        # Bytes after the last complete line; never holds a CR (CRs are rewritten on arrival).
        self._buf = b""
        # data lines of the event being read
        self._data: list[str] = []
        # The last read ended with CR: a LF that starts the next read belongs to that CRLF.
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[str]:
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if (
            not self._buf
            and not self._data
            and len(chunk) > 8
            and chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            return [chunk[6:-2].decode("utf-8", "replace")]

        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            if buf[-1] == 0x0D:
                self._skip_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = buf.rfind(b"\n")
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 1 :]
        # A LF byte never occurs inside a UTF-8 multi-byte sequence, so complete lines decode
        # on their own; a character split by the read stays in the buffer.
        lines = buf[:end].decode("utf-8", "replace").split("\n")

        events: list[str] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    text = "\n".join(data)
                    data.clear()
                    if text:
                        events.append(text)
            elif line.startswith("data"):
                if len(line) == 4:
                    data.append("")
                elif line[4] == ":":
                    value = line[5:]
                    data.append(value[1:] if value.startswith(" ") else value)
                # else: a field named like "database", which is not ours
        return events
