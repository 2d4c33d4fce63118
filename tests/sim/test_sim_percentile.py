"""``percentiles``: numpy's default percentile, bit for bit, without numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridkv.sim.percentile import percentiles

durations = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
ranks = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@given(st.lists(durations, min_size=1, max_size=300), st.lists(ranks, min_size=1, max_size=4))
def test_equals_numpy_bit_for_bit(values: list[float], qs: list[float]) -> None:
    want = [float(x) for x in np.percentile(np.array(values), qs)]
    assert percentiles(values, qs) == want


def test_worked_example() -> None:
    # ranks 0..4 of [1, 2, 4, 8, 16]: p50 is rank 2; p90 is rank 3.6 = 8 + 0.6 * 8;
    # p10 is rank 0.4 = 1 + 0.4 * 1; one value is every percentile.
    values = [16.0, 1.0, 8.0, 2.0, 4.0]
    assert percentiles(values, (0, 10, 50, 90, 100)) == [1.0, 1.4, 4.0, 12.8, 16.0]
    assert percentiles([3.5], (0, 50, 99, 100)) == [3.5] * 4


def test_no_values_or_a_rank_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentiles([], (50,))
    with pytest.raises(ValueError, match=r"in \[0, 100\]"):
        percentiles([1.0], (101,))
