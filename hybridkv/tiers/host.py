"""``HostTier``: hit units in host RAM, under a byte budget.

Each entry is one buffer holding its parts back to back (``BufferPool``:
reused by size, never more than the budget held). Copies run asynchronously
through a ``HostMemory``: ``BytesMemory`` (bytes-like parts, a copy thread;
no torch) or ``TorchHostMemory`` (tensors; on CUDA pinned buffers and a copy
stream, on the CPU a copy thread). Eviction follows the ledger's order:
least recently used, or the caller's ``ranking`` (``tiers/ranking.py``).

    tier = HostTier(fingerprint, 8 << 30)
    t = tier.store(UnitKey(block_hash, group_id), [k_page, v_page], value=saved)
    ...
    t = tier.load(key, into=[k_dst, v_dst])   # None: a miss
    if t is not None and t.wait(): ...        # False: failed, recompute

With a ``SlabMemory`` (the engine on the CPU) every entry is one slot of a
slab, and a batch of units given as rows (``Rows``: one row per device block)
moves with one transfer and one gather or scatter per part: ``store_rows`` /
``load_rows``. The ledger still keeps one entry per unit (eviction, pins and
events per unit, as with ``store_many``); only the copies and the transfer
are per batch.

Over any memory, ``store_parts`` / ``load_parts`` store and load batches of
entries given as parts per entry (the engine on CUDA: device tensors) the
same way: one transfer and one completion per batch (on CUDA one stream
switch and one event after the batch's copies, between device memory and
pinned host buffers), the reservations or pins per unit in one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any

from hybridkv.tiers.base import CopyClock, CopyStats, Parts, UnitKey
from hybridkv.tiers.copier import Copier, InlineCopier
from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.host_loads import HostLoads, Plan
from hybridkv.tiers.memory import BufferPool, BytesMemory, HostMemory
from hybridkv.tiers.ranking import RankRule
from hybridkv.tiers.transfer import Completed, Completion, Transfer

if TYPE_CHECKING:
    from hybridkv.tiers.rows import Rows

#: ``HostTier.store_rows``' batch: its keys, their rows and their values.
RowBatch = tuple[Sequence[UnitKey], "Rows", Sequence["float | None"]]
#: ``HostTier.store_parts``' batch: its keys, each unit's parts and their values.
PartBatch = tuple[Sequence[UnitKey], Sequence[Parts], Sequence["float | None"]]
#: A unit ``store_rows`` skipped: its position in its batch, and why.
Skip = tuple[int, BaseException]


class HostTier(HostLoads):
    """Hit units in host memory (module docstring)."""

    medium = "CPU"

    def __init__(
        self,
        fingerprint: ModelFingerprint,
        budget_bytes: int,
        memory: HostMemory | None = None,
        ranking: RankRule | None = None,
        copier: Copier | None = None,
    ) -> None:
        self._memory: HostMemory = memory if memory is not None else BytesMemory()
        copier = copier if copier is not None else self._memory.make_copier()
        super().__init__(fingerprint, budget_bytes, copier, ranking)
        self._pool = BufferPool(budget_bytes, self._memory.allocate)
        self._entries: dict[UnitKey, tuple[Any, tuple[int, ...]]] = {}  # key -> (buffer, sizes)
        #: Row-batch copies (``store_rows`` / ``load_rows``): bytes and seconds.
        self.copies = CopyStats(row_copy=self._slab().row_copy.name if self.takes_rows else None)

    def _measure(self, key: UnitKey, parts: Parts) -> tuple[int, tuple[int, ...]]:
        sizes = self._memory.nbytes(parts)
        return self._memory.footprint(sizes), sizes

    def _begin_store(self, key: UnitKey, parts: Parts, sizes: tuple[int, ...]) -> Completion:
        nbytes = self._memory.footprint(sizes)
        buf = self._pool.get(nbytes)
        try:
            completion = self._memory.begin_store(buf, parts, self._copier)
        except BaseException:
            self._pool.put(buf, nbytes)
            raise
        self._keep(key, buf, sizes)
        return completion

    def _keep(self, key: UnitKey, buf: Any, sizes: tuple[int, ...]) -> None:
        """``key``'s (reserved) entry is in ``buf``: noted here and on its ledger
        entry (``EntryInfo.where``: a pinned batch's load reads it there)."""
        info = self._ledger.get(key)
        assert info is not None, key
        info.where = self._entries[key] = (buf, sizes)

    def _begin_load(self, key: UnitKey, into: Sequence[Any] | None) -> Completion:
        buf, sizes = self._entries[key]
        return self._memory.begin_load(buf, sizes, into, self._copier)

    def _read_now(self, key: UnitKey) -> Sequence[Any]:
        buf, sizes = self._entries[key]
        parts, error = self._memory.begin_load(buf, sizes, None, InlineCopier()).outcome()
        if error is not None:
            raise error
        return parts

    def _drop(self, key: UnitKey) -> None:
        buf, sizes = self._entries.pop(key)
        self._pool.put(buf, self._memory.footprint(sizes))

    def _check_storage(self, keys: set[UnitKey]) -> None:
        held = set(self._entries)
        assert keys <= held, f"committed entries without a buffer: {keys - held}"
        for key, where in self._entries.items():
            info = self._ledger.get(key)
            assert info is not None and info.where is where, f"{key!r}: EntryInfo.where stale"
        footprint = self._memory.footprint
        self._pool.check_integrity(sum(footprint(s) for _, s in self._entries.values()))
        assert self._pool.in_use_bytes == self.used_bytes, (
            self._pool.in_use_bytes,
            self.used_bytes,
        )

    @property
    def held_bytes(self) -> int:
        """Host memory this tier holds: entries plus free buffers kept for reuse."""
        return self._pool.held_bytes

    # -- row batches (SlabMemory) ----------------------------------------------

    def store_rows(self, batches: Sequence[RowBatch]) -> list[tuple[Transfer, list[Skip]]]:
        """Store each batch's unit ``k`` (row ``k`` of its ``Rows``) as ``keys[k]``
        with value ``values[k]``: one transfer per batch, one gather per part, all
        the batches' copies in one job (so none of them is evicted for another:
        their entries are in flight until the job ends). A key already held is
        touched (or left in flight) and not copied; a unit the budget cannot hold
        is skipped as by ``store`` (counted, one warning). Per batch: the transfer
        of the units copied (its ``keys``; done at once when there are none) and
        each skipped unit's position with its ``TierFullError``."""
        self._check_open()
        slab = self._slab()
        for _, rows, _ in batches:
            slab.check_sizes(rows.sizes)

        def plan(b: int, keep: list[int], slots: list[Any]) -> Plan:
            rows = batches[b][1]
            return (
                partial(slab.store_rows, slots, rows.subset(keep)),
                sum(rows.sizes) * len(keep),
                1,
            )

        sized = [repeat(rows.sizes, len(keys)) for keys, rows, _ in batches]
        return self._store_batches(batches, sized, plan)

    def store_parts(self, batches: Sequence[PartBatch]) -> list[tuple[Transfer, list[Skip]]]:
        """``store_rows`` over any memory, each unit given as its parts (the engine
        on CUDA: device views): per batch one transfer and one completion (on the
        copy thread one job for every batch; on CUDA the batch's device-to-pinned
        copies queued on the copy stream at once with one event after them), not a
        transfer, a stream switch and an event per entry as ``store_many``. Every
        part is measured before anything is reserved (``ValueError``)."""
        self._check_open()
        memory = self._memory
        for keys, parts, _ in batches:
            if len(parts) != len(keys):
                raise ValueError(f"{len(keys)} keys and {len(parts)} units' parts")
        sized = [list(map(memory.nbytes, parts)) for _, parts, _ in batches]

        def plan(b: int, keep: list[int], bufs: list[Any]) -> Plan:
            sizes = [sized[b][k] for k in keep]
            start = memory.plan_store_many(bufs, [batches[b][1][k] for k in keep], sizes)
            return start, sum(map(sum, sizes)), 1

        return self._store_batches(batches, sized, plan)

    def _store_batches(
        self,
        batches: Sequence[Any],
        sized: Sequence[Iterable[tuple[int, ...]]],
        plan: Callable[[int, list[int], list[Any]], Plan],
    ) -> list[tuple[Transfer, list[Skip]]]:
        """``store_rows`` / ``store_parts``: reserve each batch's ``(keys, _, values)``
        units (of ``sized[b]`` parts' sizes), then start the copy of the units kept
        (``plan(batch number, positions, buffers)``) as one transfer per batch, every
        batch in one job."""
        clock = CopyClock(len(batches))
        footprint = self._memory.footprint
        out: list[tuple[Transfer, list[Skip]]] = []
        with self._lock:
            ledger, pool = self._ledger, self._pool
            reserved: list[UnitKey] = []
            try:
                with self._copier.collect():
                    for b, (keys, _, values) in enumerate(batches):
                        fresh: list[UnitKey] = []
                        keep: list[int] = []
                        bufs: list[Any] = []
                        skipped: list[Skip] = []
                        for k, (key, sizes) in enumerate(zip(keys, sized[b], strict=True)):
                            if key in ledger:
                                ledger.store_again(key, values[k])
                                continue
                            nbytes = footprint(sizes)
                            error = self._reserve(key, nbytes, values[k])
                            if error is not None:
                                skipped.append((k, error))
                                continue
                            buf = pool.get(nbytes)
                            self._keep(key, buf, sizes)
                            reserved.append(key)
                            fresh.append(key)
                            keep.append(k)
                            bufs.append(buf)
                        if not fresh:
                            out.append((Transfer(None, "store", Completed(), keys=()), skipped))
                            clock.remaining -= 1
                            continue
                        start, nbytes, _ = plan(b, keep, bufs)
                        settle = self._batch_settler(True, nbytes, clock)
                        completion = start(self._copier)
                        transfer = Transfer(fresh[0], "store", completion, settle, tuple(fresh))
                        out.append((transfer, skipped))
            except BaseException:  # nothing of the job ran: undo the reservations
                for key in reserved:
                    ledger.remove(key)
                    self._drop(key)
                raise
            return [(self._started(t), skipped) for t, skipped in out]
