"""Sessions replayed as users send them: turn k carries the conversation so far.

A session (replay.corpus.jsonl.Session) is a user: its first turn is sent when the session arrives
(the closed loop's free slot, a Poisson arrival, the trace's timestamp), and each later turn
after the previous answer has streamed and the user's think time has passed. Turn k is sent as
chat messages: every earlier turn's messages and the assistant's reply to it (the corpus's
recorded `assistant` text when given, so replays are reproducible, else the text that streamed),
then turn k's own messages.

The closed loop counts sessions in flight (users); with think times, fewer requests than users
are in flight at any moment, and both are recorded per step (SessionSummary).
"""

from __future__ import annotations

import asyncio
import zlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from replay.corpus.jsonl import CorpusRequest, Session
from replay.records import RequestRecord
from replay.results import SessionSummary, TurnLatency
from replay.stats import samples as stats

ThinkDistribution = Literal["fixed", "exponential"]


@dataclass(frozen=True)
class ThinkTime:
    """The user's reading time before a turn without its own think_time_s: `mean_s` seconds,
    fixed or exponentially distributed. A draw depends only on (seed, session, turn), so a
    session thinks the same whatever order the replay reaches it in."""

    mean_s: float = 0.0
    distribution: ThinkDistribution = "fixed"
    seed: int = 0

    def seconds(self, turn: CorpusRequest) -> float:
        if turn.turn is None or turn.turn <= 1:
            return 0.0
        if turn.think_time_s is not None:
            return turn.think_time_s
        if self.mean_s <= 0 or self.distribution == "fixed":
            return self.mean_s
        key = zlib.crc32((turn.session_id or "").encode("utf-8"))
        return float(np.random.default_rng([self.seed, key, turn.turn]).exponential(self.mean_s))


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """What the client sends for one turn: the whole conversation so far, as chat messages."""

    id: str
    messages: list[dict]
    max_tokens: int | None
    prompt: None = None


def turn_messages(turn: CorpusRequest) -> list[dict]:
    """The messages a turn adds to its conversation (a `prompt` is one user message)."""
    if turn.messages is not None:
        return list(turn.messages)
    return [{"role": "user", "content": turn.prompt}]


def turn_request(turn: CorpusRequest, history: Sequence[dict]) -> TurnRequest:
    return TurnRequest(id=turn.id, messages=[*history, *turn_messages(turn)], max_tokens=turn.max_tokens)


def mean_think_per_request_s(sessions: Sequence[Session], think: ThinkTime) -> float:
    """The mean think time before a turn over the corpus (none before a first turn; the default's
    mean where a turn has no think_time_s), to size windows by a user's whole cycle."""
    total = turns = 0.0
    for session in sessions:
        for turn in session.turns:
            turns += 1
            if turn.turn and turn.turn > 1:
                total += turn.think_time_s if turn.think_time_s is not None else think.mean_s
    return total / turns if turns else 0.0


class SessionCursor:
    """Hands out sessions in order, wrapping around, shared by every step of a run (as
    replay.load.drivers.RequestCursor does for requests): a session cut short by a window's end is not
    resumed, the next step starts fresh ones."""

    def __init__(self, sessions: Sequence[Session]) -> None:
        if not sessions:
            raise ValueError("no sessions to send")
        self._sessions = sessions
        self._next = 0

    def next(self) -> Session:
        session = self._sessions[self._next]
        self._next = (self._next + 1) % len(self._sessions)
        return session


class Occupancy:
    """A level over time (sessions or requests in flight): its time-weighted mean and peak over
    a window."""

    def __init__(self) -> None:
        self.level = 0
        self._changes: list[tuple[float, int]] = [(float("-inf"), 0)]

    def change(self, now: float, delta: int) -> None:
        self.level += delta
        self._changes.append((now, self.level))

    def over(self, t0: float, t1: float) -> tuple[float | None, int | None]:
        if t1 <= t0:
            return None, None
        area = 0.0
        peak = 0
        for i, (t, level) in enumerate(self._changes):
            end = self._changes[i + 1][0] if i + 1 < len(self._changes) else t1
            lo, hi = max(t, t0), min(end, t1)
            if hi > lo:
                peak = max(peak, level)
                area += level * (hi - lo)
        return area / (t1 - t0), peak


Send = Callable[..., Awaitable[RequestRecord]]


@dataclass
class SessionRunner:
    """Runs sessions through `send(request, scheduled_s, **kw)` (the step's request path) and
    keeps the occupancy and completion figures a step reports."""

    send: Send
    think: ThinkTime
    stop: asyncio.Event
    clock: Callable[[], float]
    sessions: Occupancy = field(default_factory=Occupancy)
    requests: Occupancy = field(default_factory=Occupancy)
    started_s: list[float] = field(default_factory=list)
    completed_s: list[float] = field(default_factory=list)

    async def run(self, session: Session, scheduled_s: float | None = None) -> None:
        """One session, turn by turn, until it ends, a turn fails (there is no answer to go on
        from), or the step stops sending."""
        now = self.clock()
        self.started_s.append(now)
        self.sessions.change(now, +1)
        history: list[dict] = []
        previous: RequestRecord | None = None
        try:
            for turn in session.turns:
                wait = self.think.seconds(turn)
                if wait > 0:
                    try:
                        await asyncio.wait_for(self.stop.wait(), wait)
                    except TimeoutError:
                        pass
                if self.stop.is_set():
                    return
                req = turn_request(turn, history)
                last = turn is session.turns[-1]
                keep = not last and turn.assistant is None

                def annotate(rec: RequestRecord, turn: CorpusRequest = turn, prev: RequestRecord | None = previous) -> None:
                    # Before the step accounts the record, so its observers see the turn.
                    rec.session_id, rec.turn = session.id, turn.turn
                    rec.resent_tokens = _resent(prev) if prev is not None else 0

                self.requests.change(self.clock(), +1)
                try:
                    rec = await self.send(req, scheduled_s if turn.turn == 1 else None, keep_text=keep, annotate=annotate)
                finally:
                    self.requests.change(self.clock(), -1)
                if not rec.ok:
                    return
                reply = turn.assistant if turn.assistant is not None else (rec.output_text or "")
                rec.output_text = None
                history = [*req.messages, {"role": "assistant", "content": reply}]
                previous = rec
            self.completed_s.append(self.clock())
        finally:
            self.sessions.change(self.clock(), -1)

    def summary(
        self, measured: Sequence[RequestRecord], finished_inside: Sequence[RequestRecord], t0: float, t1: float
    ) -> SessionSummary:
        """The step's session figures: occupancy over the window [t0, t1], completions inside
        it, and per turn number the measured turns' latency and tokens."""
        s_mean, s_peak = self.sessions.over(t0, t1)
        r_mean, r_peak = self.requests.over(t0, t1)
        done = [r for r in finished_inside if r.ok and r.turn is not None]
        resent = [r.resent_tokens for r in done if r.turn and r.turn > 1]
        by_turn: dict[int, list[RequestRecord]] = defaultdict(list)
        for r in measured:
            if r.ok and r.turn is not None:
                by_turn[r.turn].append(r)
        return SessionSummary(
            sessions_in_flight_mean=_round(s_mean),
            sessions_in_flight_peak=s_peak,
            requests_in_flight_mean=_round(r_mean),
            requests_in_flight_peak=r_peak,
            sessions_started=sum(1 for t in self.started_s if t0 <= t <= t1),
            sessions_completed=sum(1 for t in self.completed_s if t0 <= t <= t1),
            turns_completed=len(done),
            by_turn={str(k): _turn_latency(recs) for k, recs in sorted(by_turn.items())},
            resent_tokens=None if any(x is None for x in resent) else sum(resent),  # type: ignore[arg-type]
        )


def _resent(previous: RequestRecord) -> int | None:
    """History tokens a turn resends: the previous turn's prompt and its reply, by the server's
    usage (with a recorded assistant text, the reply the server generated stands for it)."""
    if previous.prompt_tokens is None or previous.completion_tokens is None or previous.tokens_source != "usage":
        return None
    return previous.prompt_tokens + previous.completion_tokens


def _turn_latency(records: list[RequestRecord]) -> TurnLatency:
    prompts = [r.prompt_tokens for r in records]
    resent = [r.resent_tokens for r in records]
    return TurnLatency(
        count=len(records),
        ttft_ms=stats.summarize(stats.ttft_ms(records)),
        e2e_ms=stats.summarize(stats.e2e_ms(records)),
        prompt_tokens_mean=None if any(p is None for p in prompts) else _round(sum(prompts) / len(prompts)),  # type: ignore[arg-type]
        resent_tokens_mean=None if any(x is None for x in resent) else _round(sum(resent) / len(resent)),  # type: ignore[arg-type]
    )


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
