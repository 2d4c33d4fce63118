"""``StagingRegion``: the store tier's registered memory, lent out in ranges.

One anonymous ``mmap`` (page-aligned, zero-filled on first touch), registered
with the Mooncake client once (``StoreClient.register``) and unregistered when
the tier closes. The store's zero-copy calls (``batch_put_from``,
``batch_get_into``) read and write only memory registered this way (the
client's contract: unregistered memory is undefined behaviour over RDMA).

It is split in two parts, each lent out by its own ``Ranges``:

- the **write part** (the URL's ``queue`` bytes): each unit to write is
  assembled here (header + parts) by one copy from the pool rows at the step,
  and the range is given back once its ``batch_put_from`` has returned;
- the **read part** (the URL's ``staging`` bytes): a load batch's objects are
  read here by ``batch_get_into``, checked in place, and scattered into the
  pool rows; the ranges are given back before the read job ends.

A range that does not fit is not waited for: ``take`` answers None and the
caller skips the write or fails the load (counted). Ranges start at multiples
of ``ALIGN`` bytes.

Thread-safety: ``take`` and ``give`` hold a lock (the step's thread takes
write ranges, the write thread gives them back).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
from bisect import insort

#: Every range starts at a multiple of this (a cache line; the mmap is page-aligned).
ALIGN = 64


def _round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Ranges:
    """First-fit ranges of ``[start, start + size)`` (module docstring)."""

    def __init__(self, start: int, size: int) -> None:
        self.start, self.size = start, size
        self._free: list[tuple[int, int]] = [(start, size)] if size else []  # sorted
        self._taken: dict[int, int] = {}  # offset -> rounded size
        self._lock = threading.Lock()

    @property
    def taken_bytes(self) -> int:
        with self._lock:
            return sum(self._taken.values())

    def take(self, nbytes: int) -> int | None:
        """The offset of a free range of ``nbytes`` (rounded up to ``ALIGN``), or None."""
        need = _round_up(max(nbytes, 1))
        with self._lock:
            for i, (at, size) in enumerate(self._free):
                if size >= need:
                    if size == need:
                        del self._free[i]
                    else:
                        self._free[i] = (at + need, size - need)
                    self._taken[at] = need
                    return at
        return None

    def give(self, offset: int) -> None:
        """Give back the range ``take`` answered ``offset`` (merged with free neighbours)."""
        with self._lock:
            size = self._taken.pop(offset)
            insort(self._free, (offset, size))
            merged: list[tuple[int, int]] = []
            for at, n in self._free:
                if merged and merged[-1][0] + merged[-1][1] == at:
                    merged[-1] = (merged[-1][0], merged[-1][1] + n)
                else:
                    merged.append((at, n))
            self._free = merged

    def check_integrity(self) -> None:
        """Free and taken ranges tile ``[start, start + size)`` without overlap."""
        with self._lock:
            spans = sorted([*self._free, *self._taken.items()])
        at = self.start
        for offset, n in spans:
            assert offset == at, f"a gap or overlap at {offset} (expected {at})"
            assert offset % ALIGN == 0 and n > 0, (offset, n)
            at += n
        assert at == self.start + self.size, (at, self.start + self.size)


class StagingRegion:
    """The tier's registered memory: a write part and a read part (module docstring)."""

    def __init__(self, write_bytes: int, read_bytes: int) -> None:
        write_bytes, read_bytes = _round_up(write_bytes), _round_up(read_bytes)
        self.nbytes = write_bytes + read_bytes
        self._map = mmap.mmap(-1, max(self.nbytes, mmap.PAGESIZE))
        self.view = memoryview(self._map)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self.writes = Ranges(0, write_bytes)
        self.reads = Ranges(write_bytes, read_bytes)
        self.closed = False

    def at(self, offset: int, nbytes: int) -> memoryview:
        """A writable view of ``nbytes`` at ``offset``."""
        return self.view[offset : offset + nbytes]

    def check_integrity(self) -> None:
        self.writes.check_integrity()
        self.reads.check_integrity()

    def close(self) -> None:
        """Free the memory (after the client unregistered it; views must be released)."""
        if self.closed:
            return
        self.closed = True
        self.view.release()
        with contextlib.suppress(BufferError):  # a view still alive: the GC frees the map
            self._map.close()
