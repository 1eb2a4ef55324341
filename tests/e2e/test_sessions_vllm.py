"""A two-turn session against real vLLM: the second request carries the first turn's prompt and
the reply that streamed, as vLLM's own usage.prompt_tokens shows.

The expectation is the server's /tokenize of the whole conversation (system, first user turn,
the streamed reply as the assistant's message, second user turn), so the chat template's tokens
are counted as vLLM counts them. Reads only from the shared server.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from replay.client.streaming import StreamingClient
from replay.corpus.jsonl import load_corpus
from replay.load.conversation import TurnRequest
from replay.records import RequestRecord
from replay.results import LoadSpec, StepResult
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings

pytestmark = pytest.mark.e2e

SYSTEM = "You are a careful assistant who answers in full sentences."
FIRST, SECOND = "Tell me about lighthouses.", "And who keeps them now?"
FIRST_OUTPUT_TOKENS = 24


class _Records:
    """Keeps every finished request's record (the first turn's streamed text with it)."""

    def __init__(self) -> None:
        self.records: dict[str, RequestRecord] = {}

    def step_started(self, load: LoadSpec) -> None: ...

    def request_sent(self) -> None: ...

    def request_finished(self, record: RequestRecord, *, measured: bool) -> None:
        self.records[record.request_id] = record
        # The runner drops the text once it is history; keep a copy for the expectation below.
        if record.output_text is not None:
            self.text = record.output_text

    def step_finished(self, step: StepResult) -> None: ...

    def probe_planned(self, concurrency: int, search_eta_s: float | None) -> None: ...


@pytest.mark.timeout(300)
def test_the_second_turn_resends_the_first_and_its_streamed_reply(shared_server, tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_text(json.dumps({
        "id": "e2e", "system": SYSTEM, "timestamp_s": 0,
        "conversation": [
            {"user": FIRST, "max_tokens": FIRST_OUTPUT_TOKENS},
            {"user": SECOND, "max_tokens": 4, "think_time_s": 0.2},
        ],
    }) + "\n")
    seen = _Records()
    settings = ReplaySettings(api="chat", trace=True, metrics_interval_s=0.25, request_timeout_s=120)

    async def main() -> tuple[int, int]:
        results = await run_replay(url=shared_server.url, corpus=load_corpus(path), settings=settings, slo={}, observer=seen)
        assert results.concurrency_unit == "sessions"
        (step,) = results.steps
        assert step.sessions is not None and step.sessions.sessions_completed == 1
        async with StreamingClient(shared_server.url, model=results.model, api="chat") as client:
            whole = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": FIRST},
                {"role": "assistant", "content": seen.text},
                {"role": "user", "content": SECOND},
            ]
            expected = await client.tokenize(TurnRequest(id="whole", messages=whole, max_tokens=None))
        by_turn = step.sessions.by_turn
        assert by_turn["2"].prompt_tokens_mean == seen.records["e2e#2"].prompt_tokens
        assert by_turn["2"].resent_tokens_mean == seen.records["e2e#1"].prompt_tokens + FIRST_OUTPUT_TOKENS
        return expected, seen.records["e2e#2"].prompt_tokens

    expected, second = asyncio.run(main())
    print(f"turn 1: {seen.records['e2e#1'].prompt_tokens} prompt + {seen.records['e2e#1'].completion_tokens} output tokens;"
          f" turn 2: {second} prompt tokens; /tokenize of the whole conversation: {expected}")
    first = seen.records["e2e#1"]
    assert first.ok and first.completion_tokens == FIRST_OUTPUT_TOKENS and first.tokens_source == "usage"
    assert seen.text  # the reply that streamed, sent back as the assistant's message
    assert second == expected, f"turn 2 sent {second} prompt tokens; /tokenize of the whole conversation says {expected}"
    # The history is really there: the second prompt is longer than the first with its reply's text.
    assert second > first.prompt_tokens
