"""What one request looked like from the client's side. Times are `time.perf_counter()` seconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# connect, timeout, http_<status>, broken_stream, server_error (an error event inside a 200 stream)
ErrorKind = str

TokensSource = Literal["usage", "chunks"]


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    send_s: float
    end_s: float
    first_token_s: float | None = None
    # Arrival time of every chunk that carried non-empty content (first one included).
    token_times_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # "usage" when the server sent a usage chunk; "chunks" when completion_tokens counts content
    # chunks because it did not (prompt_tokens is then None).
    tokens_source: TokensSource = "usage"
    error: ErrorKind | None = None
    error_detail: str | None = None
    # Open-loop loads: when the schedule said this request should have been sent.
    scheduled_s: float | None = None
    # Session turns only: the streamed reply's text (when asked for, to carry as history), the
    # session and turn number, and the tokens of history this turn resent (the previous turn's
    # prompt and completion tokens, from the server's usage).
    output_text: str | None = None
    session_id: str | None = None
    turn: int | None = None
    resent_tokens: int | None = None
    # Connects tried again before this request's connection opened (replay.client.transport): a sign the
    # client's loop or the server's accept stalled; its wait is inside this request's latency.
    connect_retries: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.send_s
