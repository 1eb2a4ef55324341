"""The order a run sends the corpus in (replay.load.order): every run of consecutive requests holds
the corpus's mix of lengths, wherever in the corpus a step starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.commands.replay import settings_from_args
from planner.sweep.results import SweepResults
from replay.corpus.jsonl import CorpusRequest, load_corpus, request_text
from replay.corpus.lengths import estimate_tokens
from replay.load.drivers import RequestCursor
from replay.load.order import balanced_order, bit_reversed, mixed_order, output_lengths, request_weights, send_order
from replay.results import ReplayResults
from replay.run.runner import Replay
from replay.run.settings import ReplaySettings

ROOT = Path(__file__).resolve().parents[2]
PROD = ROOT / "prompts" / "prod.jsonl"
FIXTURES = ROOT / "tests" / "fixtures" / "results"


def window_means(weights: np.ndarray, m: int) -> np.ndarray:
    """The mean weight of m consecutive requests, at every start, wrapping as the cursor does."""
    twice = np.concatenate([weights, weights])
    return np.array([twice[a : a + m].mean() for a in range(len(weights))])


def test_bit_reversal_is_a_permutation_that_halves_the_range_at_each_level():
    assert bit_reversed(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert bit_reversed(6) == [0, 4, 2, 1, 5, 3]
    for n in range(0, 70):
        assert sorted(bit_reversed(n)) == list(range(n))


def test_equal_weights_keep_the_files_order():
    assert mixed_order([5, 5, 5, 5]) == [0, 1, 2, 3]
    assert mixed_order([]) == []


def test_the_first_requests_span_the_ranks():
    weights = [10 * i for i in range(16)][::-1]  # the file lists the longest first
    order = mixed_order(weights)
    assert sorted(order) == list(range(16))
    # The shortest, then the median, then the quartiles: ranks 0, 8, 4, 12.
    assert [weights[i] for i in order[:4]] == [0, 80, 40, 120]


@pytest.mark.parametrize("m", [25, 50, 100])
def test_every_window_of_the_demo_corpus_holds_its_mix(m):
    requests = load_corpus(PROD).requests
    in_file = np.array(request_weights(requests, None), dtype=float)
    mixed = np.array(request_weights(send_order(requests, "mixed", None), None), dtype=float)
    assert sorted(mixed) == sorted(in_file)

    def spread(w: np.ndarray) -> float:
        means = window_means(w, m)
        return (means.max() - means.min()) / w.mean()

    # The figures replay.load.order's docstring quotes (m = 50: 14% against 61%).
    assert spread(mixed) < 0.3 * spread(in_file)
    if m == 50:
        assert spread(mixed) == pytest.approx(0.143, abs=0.005)
        assert spread(in_file) == pytest.approx(0.614, abs=0.005)


def kv_holding(prompt: np.ndarray, output: np.ndarray, order: list[int], m: int) -> np.ndarray:
    """What m consecutive requests keep in the KV cache on average over their time, at every start
    (wrapping), over the corpus's: sum((prompt + output / 2) x output) / sum(output)."""
    held, steps = (prompt + output / 2) * output, output.astype(float)
    overall = held.sum() / steps.sum()
    h, s = np.concatenate([held[order]] * 2), np.concatenate([steps[order]] * 2)
    return np.array([h[a : a + m].sum() / s[a : a + m].sum() for a in range(len(order))]) / overall


def test_the_balanced_orders_running_excess_never_strays_past_its_largest_request():
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 300))
        prompt = rng.lognormal(6, 1.2, n).round() + 1
        output = rng.lognormal(5, 1.0, n).round() + 1
        order = balanced_order(list(prompt), list(output))
        assert sorted(order) == list(range(n))
        held = (prompt + output / 2) * output
        excess = held - held.sum() / output.sum() * output
        running = np.cumsum(excess[order])
        assert np.abs(running).max() <= np.abs(excess).max() * (1 + 1e-9)
    assert balanced_order([], []) == []
    assert balanced_order([5, 5], [10, 10]) == [0, 1]


@pytest.mark.parametrize("m", [56, 112])
def test_every_window_of_the_demo_corpus_holds_its_kv_demand_in_the_balanced_order(m):
    # Estimated prompt tokens here (no tokenizer in the unit tests); the module's docstring
    # quotes the tiny model's tokenizer counts, which balance a little better.
    requests = load_corpus(PROD).requests
    prompt = np.array([estimate_tokens(request_text(r)) for r in requests], dtype=float)
    output = np.array(output_lengths(requests, None), dtype=float)
    index = {id(r): i for i, r in enumerate(requests)}
    balanced = [index[id(r)] for r in send_order(requests, "balanced", None)]
    mixed = [index[id(r)] for r in send_order(requests, "mixed", None)]
    spread_balanced = np.ptp(kv_holding(prompt, output, balanced, m))
    spread_mixed = np.ptp(kv_holding(prompt, output, mixed, m))
    # Measured on the same estimates: 56 requests range over 0.82-1.17 of the corpus's holding
    # balanced and 0.77-1.35 mixed; 112 over 0.88-1.10 and 0.87-1.17.
    assert spread_balanced == pytest.approx({56: 0.353, 112: 0.219}[m], abs=0.005)
    assert spread_mixed == pytest.approx({56: 0.580, 112: 0.307}[m], abs=0.005)
    # The mixed order's second 56 requests, in flight when a server start's first step opens its
    # window, held far more than the corpus; the balanced order's hold about its mean.
    assert kv_holding(prompt, output, mixed, 56)[56] > 1.15
    assert abs(kv_holding(prompt, output, balanced, 56)[56] - 1) < 0.08


def test_without_an_output_length_for_every_request_the_balanced_order_is_the_mixed_one():
    def line(prompt: str, max_tokens: int | None) -> CorpusRequest:
        return CorpusRequest(
            index=0, line=1, id=None, prompt=prompt, messages=None, max_tokens=max_tokens, timestamp_s=None, extra={}
        )

    requests = [line("x" * (40 * i + 4), None if i == 3 else 10 * i + 1) for i in range(8)]
    assert output_lengths(requests, None) is None
    assert send_order(requests, "balanced", None) == send_order(requests, "mixed", None)
    assert output_lengths(requests, 64) == [1, 11, 21, 64, 41, 51, 61, 71]
    assert send_order(requests, "balanced", 64) != send_order(requests, "mixed", 64)


def test_output_length_counts_from_the_runs_max_tokens_where_a_line_has_none():
    def line(prompt: str, max_tokens: int | None) -> CorpusRequest:
        return CorpusRequest(
            index=0, line=1, id=None, prompt=prompt, messages=None, max_tokens=max_tokens, timestamp_s=None, extra={}
        )

    requests = [line("x" * 400, None), line("x" * 4, 50)]
    assert request_weights(requests, None) == [100, 51]
    assert request_weights(requests, 200) == [300, 51]


def test_a_replay_sends_in_the_balanced_order_unless_told_another():
    corpus = load_corpus(PROD)
    expected = send_order(corpus.requests, "balanced", None)
    replay = Replay(None, corpus, ReplaySettings(), {})  # type: ignore[arg-type]
    assert isinstance(replay.cursor, RequestCursor)
    assert [replay.cursor.next() for _ in range(5)] == expected[:5]
    assert expected[:5] != corpus.requests[:5]
    assert expected[:5] != send_order(corpus.requests, "mixed", None)[:5]
    mixed = Replay(None, corpus, ReplaySettings(request_order="mixed"), {})  # type: ignore[arg-type]
    assert [mixed.cursor.next() for _ in range(5)] == send_order(corpus.requests, "mixed", None)[:5]
    in_file = Replay(None, corpus, ReplaySettings(request_order="file"), {})  # type: ignore[arg-type]
    assert [in_file.cursor.next() for _ in range(5)] == corpus.requests[:5]
    # A sweep hands the server tokenizer's counts in: the order is balanced on them.
    counts = [3 * estimate_tokens(request_text(r)) if i % 2 else 1 for i, r in enumerate(corpus.requests)]
    counted = Replay(None, corpus, ReplaySettings(), {}, prompt_tokens=counts)  # type: ignore[arg-type]
    by_counts = send_order(corpus.requests, "balanced", None, counts)
    assert by_counts != expected
    assert [counted.cursor.next() for _ in range(5)] == by_counts[:5]


def test_the_cli_flag_sets_the_order():
    from planner.cli import build_parser

    args = build_parser().parse_args(["replay", "--url", "http://x", "--prompts", "p.jsonl", "--request-order", "file"])
    assert settings_from_args(args).request_order == "file"
    args = build_parser().parse_args(["replay", "--url", "http://x", "--prompts", "p.jsonl"])
    assert settings_from_args(args).request_order == "balanced"
    args = build_parser().parse_args(["replay", "--url", "http://x", "--prompts", "p.jsonl", "--request-order", "mixed"])
    assert settings_from_args(args).request_order == "mixed"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["replay", "--url", "http://x", "--prompts", "p.jsonl", "--request-order", "sorted"])


def test_results_written_before_the_key_read_as_the_files_order():
    replay = json.loads((FIXTURES / "replay" / "replay.json").read_text())
    assert "request_order" not in replay["settings"]
    assert ReplayResults.model_validate(replay).settings["request_order"] == "file"
    now = ReplayResults.model_validate({**replay, "settings": {**replay["settings"], "request_order": "mixed"}})
    assert now.settings["request_order"] == "mixed"

    sweep = json.loads((FIXTURES / "sweep" / "sweep.json").read_text())
    sweep["settings"]["replay"] = {"min_requests": 100}
    assert SweepResults.model_validate(sweep).settings.model_dump()["replay"] == {
        "min_requests": 100, "request_order": "file", "ramp_s": 0.0,
    }
