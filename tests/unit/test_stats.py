import numpy as np
import pytest

from replay.records import RequestRecord
from replay.server.crosscheck import itl_gaps_ms
from replay.stats import samples as stats


def rec(send, first, times, end, completion=None, error=None):
    return RequestRecord(
        request_id="r", send_s=send, first_token_s=first, token_times_s=times, end_s=end,
        completion_tokens=completion, error=error,
    )


def test_summarize_matches_numpy():
    values = np.arange(1, 101, dtype=float)
    s = stats.summarize(values)
    assert s.mean == pytest.approx(50.5)
    assert s.p50 == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert s.max == 100


def test_empty_sample_is_all_none():
    s = stats.summarize([])
    assert s.model_dump() == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "max": None, "ci95": None}


def test_latencies_from_records():
    records = [
        rec(0.0, 0.1, [0.1, 0.12, 0.15], 0.15, completion=3),
        rec(1.0, 1.3, [1.3, 1.31], 1.31, completion=2),
        rec(2.0, None, [], 2.5, error="http_500"),
    ]
    assert stats.ttft_ms(records) == pytest.approx([100, 300])
    # The step's ITL: chunk gaps pooled over requests (none here inside a burst).
    assert itl_gaps_ms(records)[0] == pytest.approx([20, 30, 10])
    # (end - first) / (tokens - 1)
    assert stats.tpot_ms(records) == pytest.approx([25, 10])
    assert stats.e2e_ms(records) == pytest.approx([150, 310])


def test_tpot_counts_chunks_when_usage_is_missing():
    r = rec(0.0, 0.1, [0.1, 0.2, 0.3, 0.4, 0.5], 0.5)
    assert stats.tpot_ms([r]) == pytest.approx([100])
