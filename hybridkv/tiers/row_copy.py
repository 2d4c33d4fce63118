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

    @property
    def copy_rows(self) -> Callable[..., int]:
        """``copy_rows(dst, dst_rows, src, src_rows, sizes) -> bytes copied``, with
        ``rows.copy_rows``' arguments and contract."""


class NumpyRowCopy:
    """``rows.copy_rows``: one numpy gather or scatter per part."""

    name = "numpy"
    copy_rows = staticmethod(copy_rows)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _extent(a: np.ndarray) -> tuple[int, int]:
    """The address range ``[lo, hi)`` of every row of ``a`` (any row stride)."""
    base = _address(a)
    last = base + (a.shape[0] - 1) * a.strides[0]
    return min(base, last), max(base, last) + a.shape[1]


def _check(a: Any, name: str, writable: bool) -> None:
    if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype != np.uint8:
        raise ValueError(f"{name} must be a 2-D uint8 numpy array")
    if a.strides[1] != 1 and a.shape[1] > 1:
        raise ValueError(f"{name}: each row's bytes must be contiguous")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name} must be writable")


class _Layout:
    """A checked pair of array lists (destination, source): their bases and row
    strides for the C call, and the bounds each call's rows are checked against."""

    __slots__ = ("arrays", "dst_rows", "src_rows", "table", "widths")

    def __init__(self, dst: Sequence[Any], src: Sequence[Any]) -> None:
        parts = len(dst)
        for j, (dj, sj) in enumerate(zip(dst, src, strict=True)):
            _check(dj, f"dst[{j}]", True)
            _check(sj, f"src[{j}]", False)
            (dlo, dhi), (slo, shi) = _extent(dj), _extent(sj)
            if dlo < shi and slo < dhi:
                raise ValueError(f"part {j}: the source and destination arrays overlap")
        #: The arrays themselves: held, so that their ids (the cache's key) stay theirs.
        self.arrays = (tuple(dst), tuple(src))
        self.dst_rows = min(a.shape[0] for a in dst)
        self.src_rows = min(a.shape[0] for a in src)
        self.widths = [min(d.shape[1], s.shape[1]) for d, s in zip(dst, src, strict=True)]
        table = [0] * (4 * parts)  # dst bases, dst strides, src bases, src strides
        table[0:parts] = map(_address, dst)
        table[parts : 2 * parts] = (a.strides[0] for a in dst)
        table[2 * parts : 3 * parts] = map(_address, src)
        table[3 * parts :] = (a.strides[0] for a in src)
        self.table = array("q", table)


class NativeRowCopy:
    """A batch of rows in one native call (module docstring). ``fn``: the bound
    C function ``hkv_copy_rows``.

    The arrays are checked once per pair of array lists (2-D uint8, rows
    contiguous, the destination writable, source and destination apart) and
    their addresses kept (``_Layout``, by the arrays' ids, the arrays held:
    a numpy array's buffer never moves; so one instance per memory, as
    ``row_copy()`` gives); each call checks its rows and sizes.
    """

    name = "native"
    #: Pairs of array lists kept at most (a tier has a few: one per group and way).
    MAX_LAYOUTS = 256

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn
        self._layouts: dict[tuple[int, ...], _Layout] = {}

    def _layout(self, dst: Sequence[Any], src: Sequence[Any]) -> _Layout:
        key = (*map(id, dst), -1, *map(id, src))
        layout = self._layouts.get(key)
        if layout is None:
            layout = _Layout(dst, src)
            if len(self._layouts) >= self.MAX_LAYOUTS:
                self._layouts.clear()
            self._layouts[key] = layout
        return layout

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
        layout = self._layout(dst, src)
        for size, width in zip(sizes, layout.widths, strict=True):
            if not 0 <= size <= width:
                raise ValueError(f"{size} bytes a row: the rows hold {width} bytes")
        d, s = array("q", dst_rows), array("q", src_rows)  # (one C loop each)
        if min(d) < 0 or max(d) >= layout.dst_rows:
            raise IndexError(f"a destination row outside [0, {layout.dst_rows})")
        if min(s) < 0 or max(s) >= layout.src_rows:
            raise IndexError(f"a source row outside [0, {layout.src_rows})")
        sized = array("q", sizes)
        at = layout.table.buffer_info()[0]
        self._fn(
            parts,
            n,
            at,
            at + 8 * parts,
            d.buffer_info()[0],
            at + 16 * parts,
            at + 24 * parts,
            s.buffer_info()[0],
            sized.buffer_info()[0],
        )
        return n * sum(sizes)


@functools.cache
def _pick(mode: str | None) -> Callable[..., None] | None:
    """The C function for ``$HYBRIDKV_ROW_COPY`` = ``mode``, None for numpy (cached:
    one build, one warning)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"HYBRIDKV_ROW_COPY={mode!r}: use one of {', '.join(MODES)} (or unset)")
    if mode == "numpy":
        return None
    from hybridkv.kernels.cpu.build import NativeBuildError
    from hybridkv.kernels.cpu.ffi import c_fn

    try:
        return c_fn("hkv_copy_rows")
    except NativeBuildError as e:
        why = str(e).splitlines()[0]
        if mode == "native":
            raise ValueError(f"HYBRIDKV_ROW_COPY=native, but the native row copy: {why}") from e
        logger.warning(
            "host tier: rows are copied with numpy, not the native row copy (%s); "
            "set HYBRIDKV_ROW_COPY=numpy to choose numpy and silence this",
            why,
        )
        return None


def row_copy() -> RowCopy:
    """The row copy ``$HYBRIDKV_ROW_COPY`` asks for (module docstring): a new one
    each call, so that a ``NativeRowCopy``'s kept arrays live only as long as the
    memory that copies with it (a tier's slab, the engine's KV buffers)."""
    fn = _pick(env.row_copy())
    return NumpyRowCopy() if fn is None else NativeRowCopy(fn)
