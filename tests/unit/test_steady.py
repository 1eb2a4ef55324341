import numpy as np
import pytest

from replay.steady import mser5


@pytest.mark.timeout(10)
def test_a_decaying_start_is_dropped_and_a_stationary_series_kept():
    rng = np.random.default_rng(0)
    steady = rng.normal(100, 5, 400)
    assert mser5(steady) <= 25
    transient = steady.copy()
    transient[:60] += np.linspace(300, 0, 60)
    dropped = mser5(transient)
    assert 40 <= dropped <= 100 and dropped % 5 == 0


def test_short_series_and_the_half_cap():
    assert mser5([1.0] * 30) == 0
    # Rising throughout: the rule never drops more than half.
    assert mser5(np.arange(1000.0)) <= 500
