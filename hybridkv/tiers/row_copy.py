"""``RowCopy``: how a ``SlabMemory`` copies a batch of rows, chosen once.

Two implementations of one contract (``rows.copy_rows``'): part ``j`` of
unit ``k`` goes from row ``src_rows[k]`` of ``src[j]`` to row ``dst_rows[k]``
of ``dst[j]``, ``sizes[j]`` bytes; a row outside its array is an
``IndexError`` before anything is copied; the bytes copied are returned.

- ``NativeRowCopy``: one C call for the whole batch (``hkv_copy_rows`` in
  ``kernels/cpu/csrc/row_copy.c``, built with the native CPU kernels at first
  use: ``hybridkv.kernels.cpu.build``), streaming stores, the GIL released for
  the call. Every bound is checked here, in Python, before the call; the
  arrays of a part must not overlap (``ValueError``: the tier's never do).
- ``NumpyRowCopy``: ``rows.copy_rows``, one numpy fancy-index copy per part.

``row_copy()`` picks one by ``$HYBRIDKV_ROW_COPY`` (``hybridkv.common.env``):
``numpy``; ``native`` (a ``ValueError`` naming the reason where it cannot be
built); unset: native where it builds, else numpy with one WARNING log that
says why. The choice is visible: ``RowCopy.name``, which ``HostTier.copies``
reports (``CopyStats.row_copy``).
"""

from __future__ import annotations

import functools
import logging
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from hybridkv.common import env
from hybridkv.tiers.rows import copy_rows

logger = logging.getLogger(__name__)

#: ``$HYBRIDKV_ROW_COPY``'s values.
MODES = ("native", "numpy")


class RowCopy(Protocol):
    """Copies a batch of rows (module docstring); ``name``: ``native`` or ``numpy``."""

    name: str

    def copy_rows(
        self,
        dst: Sequence[Any],
        dst_rows: Sequence[int],
        src: Sequence[Any],
        src_rows: Sequence[int],
        sizes: Sequence[int],
    ) -> int: ...


class NumpyRowCopy:
    """``rows.copy_rows``: one numpy gather or scatter per part."""

    name = "numpy"

    def copy_rows(
        self,
        dst: Sequence[Any],
        dst_rows: Sequence[int],
        src: Sequence[Any],
        src_rows: Sequence[int],
        sizes: Sequence[int],
    ) -> int:
        return copy_rows(dst, dst_rows, src, src_rows, sizes)


def _extent(a: np.ndarray, width: int) -> tuple[int, int]:
    """The address range ``[lo, hi)`` of the first ``width`` bytes of every row of ``a``."""
    base, step = a.ctypes.data, a.strides[0]
    last = base + (a.shape[0] - 1) * step
    return min(base, last), max(base, last) + width


def _check(a: Any, name: str, writable: bool) -> None:
    if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype != np.uint8:
        raise ValueError(f"{name} must be a 2-D uint8 numpy array")
    if a.strides[1] != 1 and a.shape[1] > 1:
        raise ValueError(f"{name}: each row's bytes must be contiguous")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} must be writable")


class NativeRowCopy:
    """A batch of rows in one native call (module docstring). ``fn``: the bound
    C function ``hkv_copy_rows``."""

    name = "native"

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn

    def copy_rows(
        self,
        dst: Sequence[Any],
        dst_rows: Sequence[int],
        src: Sequence[Any],
        src_rows: Sequence[int],
        sizes: Sequence[int],
    ) -> int:
        parts = len(sizes)
        if not len(dst) == len(src) == parts:
            raise ValueError(f"{len(src)} source parts, {len(dst)} destination, {parts} sizes")
        if len(dst_rows) != len(src_rows):
            raise ValueError(f"{len(dst_rows)} destination rows for {len(src_rows)} source rows")
        n = len(dst_rows)
        if n == 0 or parts == 0:
            return 0
        d, s = array("q", dst_rows), array("q", src_rows)  # (one C loop each)
        d_lo, d_hi, s_lo, s_hi = min(d), max(d), min(s), max(s)
        layout = array("q", bytes(8 * 5 * parts))  # bases, strides, sizes
        for j, (dj, sj, size) in enumerate(zip(dst, src, sizes, strict=True)):
            _check(dj, f"dst[{j}]", True)
            _check(sj, f"src[{j}]", False)
            if d_lo < 0 or d_hi >= dj.shape[0]:
                raise IndexError(f"a destination row outside [0, {dj.shape[0]})")
            if s_lo < 0 or s_hi >= sj.shape[0]:
                raise IndexError(f"a source row outside [0, {sj.shape[0]})")
            if not 0 <= size <= min(dj.shape[1], sj.shape[1]):
                raise ValueError(
                    f"{size} bytes a row: rows of {sj.shape[1]} -> {dj.shape[1]} bytes"
                )
            (dlo, dhi), (slo, shi) = _extent(dj, size), _extent(sj, size)
            if size and dlo < shi and slo < dhi:
                raise ValueError(f"part {j}: the source and destination arrays overlap")
            layout[j], layout[parts + j] = dj.ctypes.data, dj.strides[0]
            layout[2 * parts + j], layout[3 * parts + j] = sj.ctypes.data, sj.strides[0]
            layout[4 * parts + j] = size
        at = layout.buffer_info()[0]
        self._fn(
            parts,
            n,
            at,
            at + 8 * parts,
            d.buffer_info()[0],
            at + 16 * parts,
            at + 24 * parts,
            s.buffer_info()[0],
            at + 32 * parts,
        )
        return n * sum(sizes)


@functools.cache
def _pick(mode: str | None) -> RowCopy:
    """The row copy for ``$HYBRIDKV_ROW_COPY`` = ``mode`` (cached: one build, one warning)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"HYBRIDKV_ROW_COPY={mode!r}: use one of {', '.join(MODES)} (or unset)")
    if mode == "numpy":
        return NumpyRowCopy()
    from hybridkv.kernels.cpu.build import NativeBuildError
    from hybridkv.kernels.cpu.ffi import c_fn

    try:
        return NativeRowCopy(c_fn("hkv_copy_rows"))
    except NativeBuildError as e:
        why = str(e).splitlines()[0]
        if mode == "native":
            raise ValueError(f"HYBRIDKV_ROW_COPY=native, but the native row copy: {why}") from e
        logger.warning(
            "host tier: rows are copied with numpy, not the native row copy (%s); "
            "set HYBRIDKV_ROW_COPY=numpy to choose numpy and silence this",
            why,
        )
        return NumpyRowCopy()


def row_copy() -> RowCopy:
    """The row copy ``$HYBRIDKV_ROW_COPY`` asks for (module docstring)."""
    return _pick(env.row_copy())
