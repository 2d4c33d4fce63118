"""``copy_rows``: a batch of units moved with one gather or scatter per part (or
run by run), checked against a row-by-row copy on random, consecutive and
reversed rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.tiers.rows import Rows, copy_rows


@st.composite
def row_lists(draw: st.DrawFn, limit: int, n: int, unique: bool) -> list[int]:
    kind = draw(st.sampled_from(["any", "up", "down"]))
    if kind == "up" and n:
        start = draw(st.integers(0, limit - n))
        return list(range(start, start + n))
    if kind == "down" and n:
        start = draw(st.integers(n - 1, limit - 1))
        return list(range(start, start - n, -1))
    if unique:
        return draw(st.permutations(range(limit)))[:n]
    return draw(st.lists(st.integers(0, limit - 1), min_size=n, max_size=n))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_copy_rows_equals_a_row_by_row_copy(data: st.DataObject) -> None:
    n_dst, n_src = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 10))
    widths = data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    sizes = [data.draw(st.integers(1, w)) for w in widths]
    rng = np.random.default_rng(data.draw(st.integers(0, 1 << 16)))
    dst = [np.zeros((n_dst, w), np.uint8) for w in widths]
    src = [rng.integers(0, 256, (n_src, w), dtype=np.uint8) for w in widths]
    n = data.draw(st.integers(0, min(n_dst, n_src)))
    dst_rows = data.draw(row_lists(n_dst, n, unique=True))
    src_rows = data.draw(row_lists(n_src, n, unique=False))
    want = [d.copy() for d in dst]
    for d, s in zip(dst_rows, src_rows, strict=True):
        for j, size in enumerate(sizes):
            want[j][d, :size] = src[j][s, :size]
    run_bytes = data.draw(st.sampled_from([0, 4, 1 << 30]))  # by runs, either, gathered
    assert copy_rows(dst, dst_rows, src, src_rows, sizes, run_bytes) == n * sum(sizes)
    for got, ref in zip(dst, want, strict=True):
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("run_bytes", [0, 1 << 30])  # run by run, gathered
def test_strided_rows_of_a_shared_buffer(run_bytes: int) -> None:
    """Rows whose stride is larger than their bytes (a layer's pages inside block slots)."""
    raw = np.arange(8 * 12, dtype=np.uint32).astype(np.uint8)
    rows = np.lib.stride_tricks.as_strided(raw[4:], shape=(8, 5), strides=(12, 1))
    out = np.zeros((4, 5), np.uint8)
    copy_rows([out], [0, 1, 2, 3], [rows], [6, 2, 3, 7], [5], run_bytes)
    np.testing.assert_array_equal(out, raw.reshape(8, 12)[[6, 2, 3, 7], 4:9])


def test_bad_batches_are_refused() -> None:
    a, b = np.zeros((4, 8), np.uint8), np.zeros((4, 4), np.uint8)
    with pytest.raises(IndexError, match="row outside"):
        copy_rows([a], [0], [a], [4], [8])
    with pytest.raises(ValueError, match="bytes a row"):
        copy_rows([b], [0], [a], [1], [8])
    with pytest.raises(ValueError, match="destination rows"):
        copy_rows([a], [0, 1], [a], [1], [8])
    with pytest.raises(ValueError, match="2-D uint8"):
        Rows((np.zeros((4, 8), np.float32),), [0])
    with pytest.raises(ValueError, match="contiguous"):
        Rows((a[:, ::2],), [0])


def test_rows_at_another_index_keeps_the_arrays_and_sizes() -> None:
    """``Rows.at`` (a load's batch per group) is the same arrays at new rows, the
    sizes carried over; ``subset`` goes through it."""
    a, b = np.zeros((6, 8), np.uint8), np.zeros((6, 4), np.uint8)
    template = Rows((a, b), ())
    rows = template.at([4, 1, 2])
    assert rows.arrays == (a, b) and list(rows.index) == [4, 1, 2] and rows.sizes == (8, 4)
    assert rows == Rows((a, b), [4, 1, 2]) and template.index == ()
    assert list(rows.subset([2, 0]).index) == [2, 4] and rows.subset([2, 0]).sizes == (8, 4)
