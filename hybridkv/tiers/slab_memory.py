"""``SlabMemory``: a ``HostTier`` whose entries are slots of one slab.

Every entry holds one *slot*: part ``j`` of slot ``s`` is the first bytes of
row ``s`` of ``slab[j]``, a ``[capacity, widths[j]]`` uint8 array::

    slab[0]  [ slot 0 ][ slot 1 ][ slot 2 ] ...     widths[0] bytes a row
    slab[1]  [ slot 0 ][ slot 1 ][ slot 2 ] ...     widths[1] bytes a row

An entry costs the whole slot (``footprint``: ``slot_bytes``) whatever its
parts' sizes, so a budget holds ``budget // slot_bytes`` entries exactly and
a freed slot fits any entry: no fragmentation. The engine's units all fit one
slot (a device block is one row of each KV buffer: ``BlockBytes.widths``).
The arrays are allocated untouched (``numpy.empty``): pages are paid when
first written, and ``BufferPool`` hands out fresh slots in ascending order,
so the touched part stays compact.

Batches of units given as rows (``Rows``: the device pool's buffers, one row
per block) are copied by its ``RowCopy`` (``tiers/row_copy.py``: one native
call per batch, or one numpy gather or scatter per part), on the tier's copy
thread: ``HostTier.store_rows`` / ``load_rows``. Single entries (``store`` /
``load`` of parts: tensors on the CPU, numpy arrays or bytes-like) are copied
part by part.

CPU only: on CUDA the host tier uses ``TorchHostMemory`` (pinned buffers, a
copy stream).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hybridkv.tiers.copier import Copier, ThreadCopier
from hybridkv.tiers.row_copy import RowCopy, row_copy
from hybridkv.tiers.rows import Rows
from hybridkv.tiers.transfer import Completion


def _flat(part: Any, name: str) -> np.ndarray:
    """A part's bytes as a 1-D uint8 numpy array (a view where it can be)."""
    if isinstance(part, torch.Tensor):
        if part.device.type != "cpu":
            raise ValueError(f"{name} is on {part.device}; SlabMemory holds CPU parts only")
        if not part.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous() on it first)")
        return part.detach().reshape(-1).view(torch.uint8).numpy()
    if isinstance(part, np.ndarray):
        if not part.flags.c_contiguous:
            raise ValueError(f"{name} must be contiguous")
        return part.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(memoryview(part).cast("B"), dtype=np.uint8)
    except TypeError:
        raise ValueError(
            f"{name} must be a CPU tensor, a numpy array or bytes-like, got {type(part).__name__}"
        ) from None


class SlabMemory:
    """Entries in slots of one slab, batches copied by rows (module docstring)."""

    def __init__(
        self, widths: Sequence[int], budget_bytes: int, copy: RowCopy | None = None
    ) -> None:
        """``copy``: how row batches are copied (default ``row_copy()``: by
        ``$HYBRIDKV_ROW_COPY``, native where it builds)."""
        #: How its row batches are copied (``RowCopy.name`` says which).
        self.row_copy = copy if copy is not None else row_copy()
        if not widths or any(w <= 0 for w in widths):
            raise ValueError(f"widths must be part sizes > 0, got {list(widths)}")
        self.widths = tuple(int(w) for w in widths)
        #: Bytes of one slot: what every entry costs.
        self.slot_bytes = sum(self.widths)
        self.capacity = budget_bytes // self.slot_bytes
        self.slab = tuple(np.empty((self.capacity, w), dtype=np.uint8) for w in self.widths)
        self._fresh = 0  # slots handed out so far (BufferPool reuses freed ones)

    def make_copier(self) -> Copier:
        return ThreadCopier("hybridkv-host-copy")

    def nbytes(self, parts: Sequence[Any]) -> tuple[int, ...]:
        if len(parts) > len(self.widths):
            raise ValueError(f"{len(parts)} parts; a slot holds at most {len(self.widths)}")
        sizes = tuple(_flat(p, f"part {i}").size for i, p in enumerate(parts))
        self.check_sizes(sizes)
        return sizes

    def check_sizes(self, sizes: Sequence[int]) -> None:
        """``ValueError`` unless parts of ``sizes`` fit a slot."""
        if len(sizes) > len(self.widths):
            raise ValueError(f"{len(sizes)} parts; a slot holds at most {len(self.widths)}")
        for j, (n, w) in enumerate(zip(sizes, self.widths, strict=False)):
            if n > w:
                raise ValueError(f"part {j} has {n} bytes; the slot holds {w} (SlabMemory widths)")

    def footprint(self, sizes: tuple[int, ...]) -> int:
        return self.slot_bytes

    def allocate(self, nbytes: int) -> int:
        assert nbytes == self.slot_bytes, (nbytes, self.slot_bytes)
        if self._fresh >= self.capacity:
            raise MemoryError(f"the slab's {self.capacity} slots are all handed out")
        self._fresh += 1
        return self._fresh - 1

    def begin_store(self, buf: Any, parts: Sequence[Any], copier: Copier) -> Completion:
        flat = [_flat(p, f"part {i}") for i, p in enumerate(parts)]

        def copy_in() -> None:
            for j, a in enumerate(flat):
                self.slab[j][buf, : a.size] = a

        return copier.submit(copy_in)

    def begin_load(
        self, buf: Any, sizes: tuple[int, ...], into: Sequence[Any] | None, copier: Copier
    ) -> Completion:
        if into is None:
            return copier.submit(
                lambda: tuple(self.slab[j][buf, :n].copy() for j, n in enumerate(sizes))
            )
        targets = [_flat(t, f"into[{i}]") for i, t in enumerate(into)]
        got = tuple(t.size for t in targets)
        if got != sizes:
            raise ValueError(f"into has parts of {got} bytes; the entry's are {sizes}")
        if any(not t.flags.writeable for t in targets):
            raise ValueError("into must be writable")

        def copy_out() -> tuple[Any, ...]:
            for j, t in enumerate(targets):
                t[:] = self.slab[j][buf, : t.size]
            return tuple(into or ())

        return copier.submit(copy_out)

    def plan_load_many(
        self, entries: Sequence[tuple[Any, tuple[int, ...]]], into: Sequence[Sequence[Any]]
    ) -> Callable[[Copier], Completion]:
        """Each slot's parts into ``into[k]``, all in one job."""
        moves: list[tuple[np.ndarray, np.ndarray]] = []
        for k, ((slot, sizes), targets) in enumerate(zip(entries, into, strict=True)):
            flat = [_flat(t, f"into[{k}][{j}]") for j, t in enumerate(targets)]
            got = tuple(t.size for t in flat)
            if got != sizes:
                raise ValueError(f"into[{k}] has parts of {got} bytes; the entry's are {sizes}")
            if any(not t.flags.writeable for t in flat):
                raise ValueError(f"into[{k}] must be writable")
            moves += [(t, self.slab[j][slot, : t.size]) for j, t in enumerate(flat)]

        def copy_out() -> None:
            for dst, src in moves:
                dst[:] = src

        return lambda copier: copier.submit(copy_out)

    def plan_store_many(
        self, bufs: Sequence[Any], parts: Sequence[Sequence[Any]], sizes: Sequence[tuple[int, ...]]
    ) -> Callable[[Copier], Completion]:
        """Each entry's parts into its slot, all in one job."""
        moves = [
            (self.slab[j], slot, _flat(p, f"parts[{k}][{j}]"))
            for k, (slot, ps) in enumerate(zip(bufs, parts, strict=True))
            for j, p in enumerate(ps)
        ]

        def copy_in() -> None:
            for slab, slot, a in moves:
                slab[slot, : a.size] = a

        return lambda copier: copier.submit(copy_in)

    def store_rows(self, slots: list[int], rows: Rows, copier: Copier) -> Completion:
        """Copy unit ``k`` of ``rows`` into slot ``slots[k]``: one gather per part."""
        self.check_sizes(rows.sizes)
        return copier.submit(
            self.row_copy.copy_rows,
            self.slab[: len(rows.arrays)],
            slots,
            rows.arrays,
            rows.index,
            rows.sizes,
        )

    def load_rows(self, batches: Sequence[tuple[list[int], Rows]], copier: Copier) -> Completion:
        """Copy each batch's slot ``slots[k]`` into unit ``k`` of its ``rows``: one
        job for every batch (a hit's groups), one scatter per batch and part; the
        job's result is the bytes copied."""
        copy = self.row_copy.copy_rows
        moves = []
        for slots, rows in batches:
            self.check_sizes(rows.sizes)
            into = self.slab[: len(rows.arrays)]
            moves.append((rows.arrays, rows.index, into, slots, rows.sizes))

        def copy_out() -> int:
            return sum(copy(*move) for move in moves)

        return copier.submit(copy_out)
