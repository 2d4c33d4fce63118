"""``RowCopy``: the native row copy against numpy's on random batches, its
checks before any byte moves, and the choice by ``$HYBRIDKV_ROW_COPY``."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rows import row_lists

from hybridkv.common import env
from hybridkv.kernels.cpu import build, ffi, native_status
from hybridkv.tiers import row_copy as row_copy_module
from hybridkv.tiers.row_copy import NativeRowCopy, NumpyRowCopy, row_copy


def native() -> NativeRowCopy:
    why = native_status()
    if why is not None:
        pytest.skip(f"the native row copy cannot be built here: {why}")
    return NativeRowCopy(ffi.c_fn("hkv_copy_rows"))


@pytest.fixture(autouse=True)
def fresh_choice() -> Iterator[None]:
    """Each test picks anew (``row_copy`` caches its pick per mode)."""
    row_copy_module._pick.cache_clear()
    yield
    row_copy_module._pick.cache_clear()


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_native_copies_what_numpy_copies(data: st.DataObject) -> None:
    """Random, ascending, descending and empty row sets; rows of 1 to 300 bytes
    (a streaming store's head, body and tail), strided or not."""
    copy = native()
    n_dst, n_src = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))
    widths = data.draw(st.lists(st.integers(1, 300), min_size=1, max_size=3))
    sizes = [data.draw(st.integers(0, w)) for w in widths]
    pad = data.draw(st.integers(0, 70))  # row stride = width + pad (unaligned rows)
    rng = np.random.default_rng(data.draw(st.integers(0, 1 << 16)))

    def strided(n: int, w: int) -> np.ndarray:
        raw = rng.integers(0, 256, n * (w + pad) + 1, dtype=np.uint8)
        return np.lib.stride_tricks.as_strided(raw[1:], (n, w), (w + pad, 1))

    src = [strided(n_src, w) for w in widths]
    dst = [strided(n_dst, w) for w in widths]
    n = data.draw(st.integers(0, min(n_dst, n_src)))
    dst_rows = data.draw(row_lists(n_dst, n, unique=True))
    src_rows = data.draw(row_lists(n_src, n, unique=False))
    want = [d.copy() for d in dst]
    assert NumpyRowCopy().copy_rows(want, dst_rows, src, src_rows, sizes) == n * sum(sizes)
    assert copy.copy_rows(dst, dst_rows, src, src_rows, sizes) == n * sum(sizes)
    for got, ref in zip(dst, want, strict=True):
        np.testing.assert_array_equal(got, ref)


def test_native_streams_large_rows_exactly() -> None:
    """Rows of 16 KiB + 5 bytes at odd addresses, reversed and shuffled (the
    streaming loop's whole-line body, its head and tail)."""
    copy = native()
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, 40 * 16389 + 3, dtype=np.uint8)
    src = [raw[3:].reshape(40, 16389)]
    dst = [np.zeros((64, 16389), np.uint8)]
    rows = rng.permutation(64)[:40].tolist()
    assert copy.copy_rows(dst, rows, src, list(range(39, -1, -1)), [16389]) == 40 * 16389
    np.testing.assert_array_equal(dst[0][rows], src[0][::-1])


def test_bad_rows_raise_before_anything_is_copied() -> None:
    copy = native()
    a = np.arange(32, dtype=np.uint8).reshape(4, 8)
    b = np.zeros((4, 8), np.uint8)
    for dst_rows, src_rows in (([0, 4], [0, 1]), ([0, -1], [0, 1]), ([0, 1], [0, 4])):
        with pytest.raises(IndexError, match="row outside"):
            copy.copy_rows([b], dst_rows, [a], src_rows, [8])
        assert not b.any()  # the first row was not copied either
    with pytest.raises(ValueError, match="bytes a row"):
        copy.copy_rows([b[:, :4]], [0], [a], [1], [8])
    with pytest.raises(ValueError, match="destination rows"):
        copy.copy_rows([b], [0, 1], [a], [1], [8])
    with pytest.raises(ValueError, match="overlap"):
        copy.copy_rows([a], [0], [a], [1], [8])
    with pytest.raises(ValueError, match="writable"):
        copy.copy_rows([np.broadcast_to(a[0], (4, 8))], [0], [a], [1], [8])
    with pytest.raises(ValueError, match="2-D uint8"):
        copy.copy_rows([b.view(np.int8)], [0], [a], [1], [8])
    assert copy.copy_rows([b], [], [a], [], [8]) == 0 and not b.any()


def test_the_choice_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.ROW_COPY, "numpy")
    assert row_copy().name == "numpy"
    monkeypatch.setenv(env.ROW_COPY, "memcpy")
    with pytest.raises(ValueError, match="HYBRIDKV_ROW_COPY='memcpy'"):
        row_copy()
    native()  # (skips where it cannot be built)
    monkeypatch.delenv(env.ROW_COPY)
    assert row_copy().name == "native"
    monkeypatch.setenv(env.ROW_COPY, "native")
    assert row_copy().name == "native"


def test_no_native_build_is_numpy_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(name: str) -> None:
        raise build.NativeBuildError("no C compiler here\nmore lines")

    monkeypatch.setattr(ffi, "c_fn", fail)
    monkeypatch.delenv(env.ROW_COPY, raising=False)
    with caplog.at_level(logging.WARNING, logger=row_copy_module.__name__):
        assert row_copy().name == "numpy" and row_copy().name == "numpy"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "no C compiler here" in warned[0] and "more" not in warned[0]
    monkeypatch.setenv(env.ROW_COPY, "native")  # asked for by name: an error, not numpy
    with pytest.raises(ValueError, match=r"HYBRIDKV_ROW_COPY=native.*no C compiler here"):
        row_copy()


def test_each_memory_gets_its_own_native_copy() -> None:
    """The arrays a native copy keeps (by their ids) live only as long as its memory:
    ``row_copy()`` makes a new one each call, over the one C function."""
    native()
    first, second = row_copy(), row_copy()
    assert isinstance(first, NativeRowCopy) and first is not second
    a, b = np.zeros((4, 8), np.uint8), np.ones((4, 8), np.uint8)
    first.copy_rows([a], [2], [b], [1], [8])
    assert a[2].all() and not second._layouts and len(first._layouts) == 1
