import itertools

import numpy as np
import pytest

from replay.load.kinds import Concurrency, PoissonRate, TraceReplay, poisson_offsets, trace_offsets


def test_poisson_is_seeded_and_has_the_right_rate():
    a = list(itertools.islice(poisson_offsets(5.0, seed=7), 20000))
    b = list(itertools.islice(poisson_offsets(5.0, seed=7), 20000))
    c = list(itertools.islice(poisson_offsets(5.0, seed=8), 20000))
    assert a == b and a != c
    gaps = np.diff([0.0, *a])
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert all(g >= 0 for g in gaps)


def test_trace_offsets_sorted_and_sped_up():
    assert trace_offsets([10.0, 4.0, 6.0], speed=2.0) == [(0.0, 1), (1.0, 2), (3.0, 0)]
    assert trace_offsets([], speed=1.0) == []
    with pytest.raises(ValueError):
        trace_offsets([1.0], speed=0)


def test_specs_keep_the_seed():
    assert PoissonRate(2.5, seed=3).spec().model_dump() == {"mode": "rate", "value": 2.5, "seed": 3}
    assert Concurrency(8).spec().value == 8
    assert TraceReplay(4).spec().mode == "trace"
