"""Units as rows: batches of hit units copied with one gather or scatter per part.

A device pool keeps each layer's bytes of block ``b`` in row ``b`` of a 2-D
byte array (``BlockBytes.rows``), and a ``SlabMemory`` keeps part ``j`` of
slot ``s`` in row ``s`` of its ``j``-th array. A batch of units is then
``Rows``: unit ``k``'s part ``j`` is ``arrays[j][index[k]]``, and copying
the batch is one numpy fancy-index copy per part (a C loop over the rows),
not one Python-level copy per unit and part::

    device part j  [ b0 ][ b1 ][ b2 ][ b3 ] ...      Rows(arrays, index=[3, 0])
    slab part j    [ s0 ][ s1 ][ s2 ] ...            slots [1, 2]
    store_rows:    slab_j[[1, 2]] = device_j[[3, 0]]   (one gather per part)

An index that runs through consecutive rows (up or down) becomes a slice, so
that side is a plain view and the copy a single pass. A scatter (source rows
one run) is one pass too; a gather goes through a temporary, so when its
rows are large it is copied run by run instead (``MIN_RUN_BYTES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Rows:
    """Units whose parts are rows: unit ``k``'s part ``j`` is ``arrays[j][index[k]]``.

    ``arrays``: 2-D ``uint8`` numpy arrays, one per part (rows may be strided; a
    row's bytes are contiguous). ``index``: one row per unit.
    """

    arrays: tuple[Any, ...]
    index: Sequence[int]
    #: Each part's bytes (the same for every unit of the batch).
    sizes: tuple[int, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        for j, a in enumerate(self.arrays):
            if not isinstance(a, np.ndarray) or a.ndim != 2 or a.dtype != np.uint8:
                raise ValueError(f"Rows.arrays[{j}] must be a 2-D uint8 numpy array")
            if a.strides[1] != 1:
                raise ValueError(f"Rows.arrays[{j}]: each row's bytes must be contiguous")
        object.__setattr__(self, "sizes", tuple(a.shape[1] for a in self.arrays))

    def subset(self, keep: Sequence[int]) -> Rows:
        """The units at positions ``keep`` of this batch."""
        if len(keep) == len(self.index):
            return self
        return self.at([self.index[k] for k in keep])

    def at(self, index: Sequence[int]) -> Rows:
        """These arrays at rows ``index``: a new batch without checking the arrays
        again (they were, when this one was made): a load makes one per group."""
        out = object.__new__(Rows)
        for name, value in (("arrays", self.arrays), ("index", index), ("sizes", self.sizes)):
            object.__setattr__(out, name, value)
        return out


def _index(rows: list[int], limit: int, what: str) -> slice | np.ndarray:
    """``rows`` (ints, not empty) as an index of the first axis: an ascending run
    of consecutive rows as a slice, a descending one as a reversed slice
    (``step=-1``), anything else as an int64 array; ``IndexError`` for a row
    outside ``[0, limit)``. A run is found with one list comparison (a C loop);
    only an index that is no run pays numpy calls (each about 1 us)."""
    n, first, last = len(rows), rows[0], rows[-1]
    out: slice | np.ndarray
    if last - first == n - 1 and rows == list(range(first, last + 1)):
        lo, hi, out = first, last, slice(first, last + 1)
    elif first - last == n - 1 and rows == list(range(first, last - 1, -1)):
        lo, hi, out = last, first, slice(first, last - 1 if last > 0 else None, -1)
    else:
        a = np.asarray(rows, dtype=np.int64)
        lo, hi, out = int(a.min()), int(a.max()), a
    if lo < 0 or hi >= limit:
        raise IndexError(f"a {what} row outside [0, {limit})")
    return out


#: A gather copies run by run (a slice copy per run of rows consecutive on both
#: sides) when its runs average at least this many bytes a part, else with one
#: fancy-index gather (a C loop, but through a temporary: a second pass over
#: the bytes). A slice copy costs about 0.2-0.3 us of Python, and the second
#: pass about as much per 4-6 KiB (memcpy at 15-20 GB/s); measured on this
#: project's 2-core VM (64 rows: per row 19 us against 16 us gathered at 8 KiB
#: rows, 63 us against 120 us at 48 KiB), the crossover is between 8 and 16 KiB.
#: (``np.take(out=)`` is no way round the temporary: on a strided source, the
#: device pool's rows, it first copies the whole source array.)
MIN_RUN_BYTES = 16 << 10


def _ints(rows: Sequence[int]) -> list[int]:
    """``rows`` as a new list of Python ints (a list of ints is copied in C)."""
    return list(rows) if isinstance(rows, list) else np.asarray(rows, dtype=np.int64).tolist()


def _runs(d: list[int], s: list[int]) -> list[tuple[int, int, int]]:
    """``(destination row, source row, length)`` of each run of pairs that both
    ascend by one row."""
    if len(d) == 1:
        return [(d[0], s[0], 1)]
    da, sa = np.asarray(d), np.asarray(s)
    breaks = np.flatnonzero((np.diff(da) != 1) | (np.diff(sa) != 1)) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), len(d)]
    return [(d[a], s[a], b - a) for a, b in zip(starts, ends, strict=True)]


def copy_rows(
    dst: Sequence[Any],
    dst_rows: Sequence[int],
    src: Sequence[Any],
    src_rows: Sequence[int],
    sizes: Sequence[int],
    min_run_bytes: int = MIN_RUN_BYTES,
) -> int:
    """``dst[j][dst_rows[k], :n] = src[j][src_rows[k], :n]`` with ``n = sizes[j]``,
    for every part ``j`` and unit ``k``; the bytes copied. ``dst_rows`` must not
    repeat a row. A gather (source rows not one run) whose runs average
    ``min_run_bytes`` a part or more is copied run by run (``MIN_RUN_BYTES``)."""
    if not len(dst) == len(src) == len(sizes):
        raise ValueError(f"{len(src)} source parts, {len(dst)} destination, {len(sizes)} sizes")
    if len(dst_rows) != len(src_rows):
        raise ValueError(f"{len(dst_rows)} destination rows for {len(src_rows)} source rows")
    if not dst_rows:
        return 0
    d, s = _ints(dst_rows), _ints(src_rows)
    if len(d) > 1 and d[0] > d[-1]:  # pair them with the destination ascending
        d.reverse()
        s.reverse()
    di = _index(d, dst[0].shape[0], "destination")
    si = _index(s, src[0].shape[0], "source")
    runs = None if isinstance(si, slice) else _runs(d, s)
    total = 0
    for dj, sj, n in zip(dst, src, sizes, strict=True):
        if n > dj.shape[1] or n > sj.shape[1]:
            raise ValueError(f"{n} bytes a row: rows of {sj.shape[1]} -> {dj.shape[1]} bytes")
        if runs is not None and n * len(d) >= min_run_bytes * len(runs):
            for d0, s0, k in runs:
                dj[d0 : d0 + k, :n] = sj[s0 : s0 + k, :n]
        else:
            dj[di, :n] = sj[si, :n]
        total += n * len(d)
    return total
