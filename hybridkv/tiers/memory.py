"""Host memory for ``HostTier``: buffers reused by size, and bytes copies.

``BufferPool`` hands out one buffer per entry and takes it back when the entry
goes; freed buffers are kept per size (a model's units come in a few sizes)
and reused, because touching fresh memory costs far more than the copy
(first-touch page faults: 1.6 GB/s against 17-20 GB/s of memcpy on this
project's 2-core VM). What the pool holds, in use or free, never exceeds the
tier's budget: a new size first releases free buffers of other sizes.

``HostMemory`` is what a ``HostTier`` copies with. ``BytesMemory`` (no torch)
stores bytes-like parts (anything with the buffer protocol) in ``bytearray``s
on a copy thread; ``tiers/torch_memory.py`` stores tensors (pinned memory and
a copy stream on CUDA).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hybridkv.tiers.copier import Copier, ThreadCopier
from hybridkv.tiers.transfer import Completion

if TYPE_CHECKING:
    from hybridkv.tiers.row_copy import RowCopy


class BufferPool:
    """Buffers of exact sizes, reused; ``held_bytes <= budget_bytes`` always."""

    def __init__(self, budget_bytes: int, allocate: Callable[[int], Any]) -> None:
        self.budget_bytes = budget_bytes
        self._allocate = allocate
        self._free: dict[int, list[Any]] = {}
        self.in_use_bytes = 0
        self.free_bytes = 0

    @property
    def held_bytes(self) -> int:
        return self.in_use_bytes + self.free_bytes

    def get(self, nbytes: int) -> Any:
        """A buffer of ``nbytes`` (the caller's ledger has reserved them)."""
        spare = self._free.get(nbytes)
        if spare:
            buf = spare.pop()
            self.free_bytes -= nbytes
        else:
            for size in sorted(self._free, reverse=True):
                if self.held_bytes + nbytes <= self.budget_bytes:
                    break
                self.free_bytes -= size * len(self._free[size])
                self._free[size] = []
            assert self.held_bytes + nbytes <= self.budget_bytes, "pool asked past its budget"
            buf = self._allocate(nbytes)
        self.in_use_bytes += nbytes
        return buf

    def put(self, buf: Any, nbytes: int) -> None:
        """Take back a buffer of ``nbytes`` (its entry is gone)."""
        self.in_use_bytes -= nbytes
        self._free.setdefault(nbytes, []).append(buf)
        self.free_bytes += nbytes

    def check_integrity(self, in_use_bytes: int) -> None:
        free = sum(size * len(bufs) for size, bufs in self._free.items())
        assert free == self.free_bytes, (free, self.free_bytes)
        assert self.in_use_bytes == in_use_bytes, (self.in_use_bytes, in_use_bytes)
        assert self.held_bytes <= self.budget_bytes, (self.held_bytes, self.budget_bytes)


class HostMemory(Protocol):
    """How a ``HostTier`` allocates and copies (module docstring)."""

    def make_copier(self) -> Copier:
        """The copier a tier uses with this memory when given none."""

    def nbytes(self, parts: Sequence[Any]) -> tuple[int, ...]:
        """Each part's size in bytes (``ValueError`` naming a part it cannot store)."""

    def footprint(self, sizes: tuple[int, ...]) -> int:
        """Bytes an entry of parts of ``sizes`` holds (its buffer's size)."""

    def allocate(self, nbytes: int) -> Any:
        """A new buffer of ``nbytes``."""

    def begin_store(self, buf: Any, parts: Sequence[Any], copier: Copier) -> Completion:
        """Copy ``parts`` back to back into ``buf``."""

    def begin_load(
        self, buf: Any, sizes: tuple[int, ...], into: Sequence[Any] | None, copier: Copier
    ) -> Completion:
        """Copy ``buf``'s parts out: into ``into`` (checked), or into new objects."""

    def plan_load_many(
        self, entries: Sequence[tuple[Any, tuple[int, ...]]], into: Sequence[Sequence[Any]]
    ) -> Callable[[Copier], Completion]:
        """Check that entry ``k`` (``(buffer, sizes)``) fits ``into[k]`` (``ValueError``
        naming the first that does not); return what starts the copies of every
        entry as *one* completion: one job on the copier (on CUDA, copies queued
        on the copy stream and one event after them). Nothing is copied until it
        is called (``HostTier.load_parts`` checks every batch first)."""

    def plan_store_many(
        self, bufs: Sequence[Any], parts: Sequence[Sequence[Any]], sizes: Sequence[tuple[int, ...]]
    ) -> Callable[[Copier], Completion]:
        """What starts copying ``parts[k]`` (measured by ``nbytes``: ``sizes[k]``)
        back to back into ``bufs[k]`` for every ``k`` as *one* completion: one job
        on the copier (on CUDA, the copies queued on the copy stream and one event
        after them, the sources kept alive until it has passed). Nothing is copied
        until it is called (``HostTier.store_parts``)."""


class RowMemory(HostMemory, Protocol):
    """A ``HostMemory`` of fixed slots that also copies batches of units given as
    rows (``SlabMemory``; ``HostTier.store_rows`` / ``load_rows``)."""

    slot_bytes: int
    #: How its row batches are copied (``tiers/row_copy.py``).
    row_copy: RowCopy

    def check_sizes(self, sizes: Sequence[int]) -> None:
        """``ValueError`` unless parts of ``sizes`` fit a slot."""

    def store_rows(self, slots: list[int], rows: Any, copier: Copier) -> Completion:
        """Copy unit ``k`` of ``rows`` (a ``Rows``) into slot ``slots[k]``."""

    def load_rows(self, batches: Sequence[tuple[list[int], Any]], copier: Copier) -> Completion:
        """Copy each batch's slot ``slots[k]`` into unit ``k`` of its ``rows`` (a
        ``Rows``), all in one job."""


def byte_view(part: Any, name: str) -> memoryview:
    try:
        view = memoryview(part)
    except TypeError:
        raise ValueError(
            f"{name} must be bytes-like (the buffer protocol), got {type(part).__name__}; "
            "for tensors give HostTier a TorchHostMemory"
        ) from None
    if not view.contiguous:
        raise ValueError(f"{name} must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _address(obj: Any) -> int:
    if isinstance(obj, bytes):  # immutable: its buffer is the object's own storage
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0
    return ctypes.addressof(ctypes.c_char.from_buffer(obj))


def copy_bytes(dst: Any, dst_off: int, src: Any, src_off: int, n: int) -> None:
    """Copy ``n`` bytes; a memcpy with the GIL released (ctypes drops it around
    the call) so the copy thread and the caller's thread run at once. A
    read-only source other than ``bytes`` (a read-only memoryview) is copied
    under the GIL."""
    if not n:
        return
    if memoryview(src).readonly and not isinstance(src, bytes):
        memoryview(dst).cast("B")[dst_off : dst_off + n] = memoryview(src).cast("B")[
            src_off : src_off + n
        ]
        return
    ctypes.memmove(_address(dst) + dst_off, _address(src) + src_off, n)


#: One ``copy_bytes`` call's arguments: (destination, its offset, source, its offset, bytes).
_Move = tuple[Any, int, Any, int, int]


def _packed(parts: Sequence[Any], sizes: Sequence[int]) -> list[tuple[Any, int, int]]:
    """Each part with its offset in an entry's buffer (the parts back to back) and size."""
    out, off = [], 0
    for part, n in zip(parts, sizes, strict=True):
        out.append((part, off, n))
        off += n
    return out


def _job(moves: list[_Move]) -> Callable[[Copier], Completion]:
    """What submits ``moves`` as one job on a copier."""

    def copy() -> None:
        for move in moves:
            copy_bytes(*move)

    return lambda copier: copier.submit(copy)


class BytesMemory:
    """Bytes-like parts in ``bytearray``s, copied on one copy thread."""

    def make_copier(self) -> Copier:
        return ThreadCopier("hybridkv-host-copy")

    def nbytes(self, parts: Sequence[Any]) -> tuple[int, ...]:
        return tuple(byte_view(p, f"part {i}").nbytes for i, p in enumerate(parts))

    def footprint(self, sizes: tuple[int, ...]) -> int:
        return sum(sizes)

    def allocate(self, nbytes: int) -> bytearray:
        return bytearray(nbytes)

    def begin_store(self, buf: Any, parts: Sequence[Any], copier: Copier) -> Completion:
        sized = [(p, byte_view(p, f"part {i}").nbytes) for i, p in enumerate(parts)]

        def copy_in() -> None:
            off = 0
            for part, n in sized:
                copy_bytes(buf, off, part, 0, n)
                off += n

        return copier.submit(copy_in)

    def begin_load(
        self, buf: Any, sizes: tuple[int, ...], into: Sequence[Any] | None, copier: Copier
    ) -> Completion:
        if into is not None:
            targets = [byte_view(t, f"into[{i}]") for i, t in enumerate(into)]
            got = tuple(t.nbytes for t in targets)
            if got != sizes:
                raise ValueError(f"into has parts of {got} bytes; the entry's are {sizes}")
            if any(t.readonly for t in targets):
                raise ValueError("into must be writable buffers (bytearray, writable memoryview)")

        def copy_out() -> tuple[Any, ...]:
            src = memoryview(buf)
            offs = [sum(sizes[:i]) for i in range(len(sizes))]
            if into is None:
                return tuple(bytes(src[o : o + n]) for o, n in zip(offs, sizes, strict=True))
            for target, o, n in zip(into, offs, sizes, strict=True):
                copy_bytes(target, 0, buf, o, n)
            return tuple(into)

        return copier.submit(copy_out)

    def plan_load_many(
        self, entries: Sequence[tuple[Any, tuple[int, ...]]], into: Sequence[Sequence[Any]]
    ) -> Callable[[Copier], Completion]:
        moves: list[_Move] = []
        for k, ((buf, sizes), targets) in enumerate(zip(entries, into, strict=True)):
            views = [byte_view(t, f"into[{k}][{j}]") for j, t in enumerate(targets)]
            got = tuple(v.nbytes for v in views)
            if got != sizes:
                raise ValueError(f"into[{k}] has parts of {got} bytes; the entry's are {sizes}")
            if any(v.readonly for v in views):
                raise ValueError(f"into[{k}] must be writable buffers")
            moves += [(t, 0, buf, off, n) for t, off, n in _packed(targets, sizes)]
        return _job(moves)

    def plan_store_many(
        self, bufs: Sequence[Any], parts: Sequence[Sequence[Any]], sizes: Sequence[tuple[int, ...]]
    ) -> Callable[[Copier], Completion]:
        moves: list[_Move] = []
        for buf, ps, ns in zip(bufs, parts, sizes, strict=True):
            moves += [(buf, off, p, 0, n) for p, off, n in _packed(ps, ns)]
        return _job(moves)
