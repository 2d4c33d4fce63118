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
from itertools import chain, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast

from hybridkv.tiers.base import CopyClock, CopyStats, Parts, UnitKey
from hybridkv.tiers.copier import Copier, InlineCopier
from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.ledger import PinBatch
from hybridkv.tiers.ledger_tier import LedgerTier
from hybridkv.tiers.memory import BufferPool, BytesMemory, HostMemory, RowMemory
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
#: An entry's slot, and its parts' sizes (``HostTier._entries``' values).
_SLOT, _SIZES = itemgetter(0), itemgetter(1)
#: A batch load's copy, ready to start on the tier's copier, and its bytes.
_Plan = tuple[Callable[[Copier], Completion], int]


class HostTier(LedgerTier):
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
        self.copies = CopyStats()

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
        self._entries[key] = (buf, sizes)
        return completion

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

    @property
    def takes_rows(self) -> bool:
        """True when ``store_rows`` / ``load_rows`` work (the memory is a ``RowMemory``)."""
        return hasattr(self._memory, "store_rows")

    def _slab(self) -> RowMemory:
        if not self.takes_rows:
            raise ValueError(
                f"row batches need a HostTier over a SlabMemory, not {type(self._memory).__name__}"
            )
        return cast(RowMemory, self._memory)

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

        def plan(b: int, keep: list[int], slots: list[Any]) -> _Plan:
            rows = batches[b][1]
            return partial(slab.store_rows, slots, rows.subset(keep)), sum(rows.sizes) * len(keep)

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

        def plan(b: int, keep: list[int], bufs: list[Any]) -> _Plan:
            sizes = [sized[b][k] for k in keep]
            start = memory.plan_store_many(bufs, [batches[b][1][k] for k in keep], sizes)
            return start, sum(map(sum, sizes))

        return self._store_batches(batches, sized, plan)

    def _store_batches(
        self,
        batches: Sequence[Any],
        sized: Sequence[Iterable[tuple[int, ...]]],
        plan: Callable[[int, list[int], list[Any]], _Plan],
    ) -> list[tuple[Transfer, list[Skip]]]:
        """``store_rows`` / ``store_parts``: reserve each batch's ``(keys, _, values)``
        units (of ``sized[b]`` parts' sizes), then start the copy of the units kept
        (``plan(batch number, positions, buffers)``) as one transfer per batch, every
        batch in one job."""
        clock = CopyClock(len(batches))
        footprint = self._memory.footprint
        out: list[tuple[Transfer, list[Skip]]] = []
        with self._lock:
            ledger, entries, pool = self._ledger, self._entries, self._pool
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
                            entries[key] = (buf, sizes)
                            reserved.append(key)
                            fresh.append(key)
                            keep.append(k)
                            bufs.append(buf)
                        if not fresh:
                            out.append((Transfer(None, "store", Completed(), keys=()), skipped))
                            clock.remaining -= 1
                            continue
                        start, nbytes = plan(b, keep, bufs)
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

    def load_rows(
        self,
        batches: Sequence[tuple[Sequence[UnitKey], Rows]],
        wake: bool = True,
        pins: PinBatch | None = None,
    ) -> list[Transfer]:
        """Copy each batch's ``keys[k]`` entry into row ``k`` of its ``Rows``: one
        transfer per batch, one scatter per part, all in one job. Every key must be
        held (``KeyError`` otherwise, nothing pinned): pin them first when anything
        may evict them meanwhile. ``pins``: a ``pin_batch`` of exactly these keys,
        whose pins the transfers take over (no second pin, no unpin). ``wake=False``:
        the copy thread is not woken for the job (``ThreadCopier.queue``): it runs
        when a transfer is waited for, or at ``wake()``; for a caller that waits at
        once, or wakes the tier itself."""
        self._check_open()
        slab = self._slab()
        clock = CopyClock(len(batches))
        with self._lock:
            planned: list[_Plan | None] = []
            for keys, rows in batches:  # (C-level maps: this runs once per unit)
                found = self._found(keys, "load_rows")
                sizes = rows.sizes
                if set(map(_SIZES, found)) - {sizes}:
                    bad = next(e[1] for e in found if e[1] != sizes)
                    raise ValueError(f"an entry has parts of {bad}, the rows {sizes}")
                slots = list(map(_SLOT, found))
                start = partial(slab.load_rows, slots, rows)
                planned.append((start, sum(sizes) * len(keys)) if keys else None)
            return self._start_loads(batches, planned, wake, pins, clock)

    def load_parts(
        self,
        batches: Sequence[tuple[Sequence[UnitKey], Sequence[Parts]]],
        wake: bool = True,
        pins: PinBatch | None = None,
    ) -> list[Transfer]:
        """Copy each batch's ``keys[k]`` entry into the parts ``into[k]``, over any
        memory: one transfer per batch and one completion (on the copy thread one
        job for every batch; on CUDA each batch's copies queued on the copy stream
        at once with one event after them), not a transfer, a pin, a stream switch
        and an event per entry as ``load_many``. Every key must be held and every
        ``into`` fit its entry (``KeyError`` / ``ValueError`` before anything is
        pinned or copied). ``wake``, ``pins``: as ``load_rows``."""
        self._check_open()
        clock = CopyClock(len(batches))
        with self._lock:
            planned: list[_Plan | None] = []
            for keys, into in batches:
                if len(into) != len(keys):
                    raise ValueError(f"{len(keys)} keys and {len(into)} into")
                found = self._found(keys, "load_parts")
                nbytes = sum(map(sum, map(_SIZES, found)))
                start = self._memory.plan_load_many(found, into)
                planned.append((start, nbytes) if keys else None)
            return self._start_loads(batches, planned, wake, pins, clock)

    def _found(self, keys: Sequence[UnitKey], what: str) -> list[tuple[Any, tuple[int, ...]]]:
        """Each key's ``(buffer, sizes)`` (``KeyError`` naming one not held). Under the lock."""
        found = list(map(self._entries.get, keys))
        if None in found:
            missing = keys[found.index(None)]
            raise KeyError(f"{what} of {missing!r}: the {self.medium} tier lacks it")
        return found  # type: ignore[return-value]

    def _start_loads(
        self,
        batches: Sequence[tuple[Sequence[UnitKey], Any]],
        planned: list[_Plan | None],
        wake: bool,
        pins: PinBatch | None,
        clock: CopyClock,
    ) -> list[Transfer]:
        """Pin the batches' keys (or take ``pins`` over) and start each batch's
        planned copy (None: an empty batch) as one transfer, all in one job. Under
        the lock."""
        every = list(chain.from_iterable(keys for keys, _ in batches))
        self._pin_loads(every, pins)
        out: list[Transfer] = []
        try:
            with self._copier.collect(wake):
                for (keys, _), plan in zip(batches, planned, strict=True):
                    if plan is None:
                        out.append(Transfer(None, "load", Completed(), keys=()))
                        clock.remaining -= 1
                        continue
                    settle = self._batch_settler(False, plan[1], clock)
                    completion = plan[0](self._copier)
                    out.append(Transfer(keys[0], "load", completion, settle, tuple(keys)))
        except BaseException:  # nothing of the job ran: undo the pins (the caller's stay)
            if pins is None:
                self._ledger.unpin_many(every)
            raise
        if pins is not None:
            self._take_batch(pins)  # the transfers hold its pins now
        return [self._started(t) for t in out]

    def _pin_loads(self, every: list[UnitKey], pins: PinBatch | None) -> None:
        """Pin (and touch) the keys a batch load copies, all committed (``KeyError``
        naming one that is not, nothing pinned); or, given ``pins``, check that it
        is a held batch of exactly these keys. Under the lock."""
        if pins is None:
            try:
                self._ledger.pin_committed(every)  # (all or nothing)
            except KeyError as e:
                lacks = f"a load of {e.args[0]!r}: the {self.medium} tier lacks it"
                raise KeyError(lacks) from None
        elif pins.released or (
            pins.keys != every  # (the same keys in the same order: the caller's case)
            and (len(pins.keys) != len(every) or set(pins.keys) != set(every))
        ):
            raise ValueError("a batch load's pins=: a pin batch held of exactly the keys loaded")

    def _batch_settler(
        self, store: bool, nbytes: int, clock: CopyClock
    ) -> Callable[[Transfer], None]:
        def settle(transfer: Transfer) -> None:
            self._settle_batch(transfer, store, nbytes, clock)

        return settle

    def _settle_batch(self, transfer: Transfer, store: bool, nbytes: int, clock: CopyClock) -> None:
        with self._lock:
            clock.remaining -= 1
            seconds = None if clock.remaining else clock.elapsed()
            self._in_flight.discard(transfer)
            ledger, n, ok = self._ledger, len(transfer.keys), transfer.error is None
            if not store:
                ledger.unpin_many(transfer.keys)
            else:
                for key in transfer.keys:
                    if ok:
                        ledger.commit(key)
                    else:
                        ledger.remove(key)
                        self._drop(key)
            if ok:
                (self.copies.store if store else self.copies.load).add(nbytes, seconds)
            if store:
                self.stats.stores += n if ok else 0
                self.stats.store_failures += 0 if ok else n
            else:
                self.stats.loads += n if ok else 0
                self.stats.load_failures += 0 if ok else n
            if not ok:
                self._warn_once(
                    f"rows:{type(transfer.error).__name__}",
                    f"{self.medium} tier: a batch copy failed ({transfer.error}); "
                    "its units were skipped (further failures are counted)",
                )
