"""``HostLoads``: a host tier's batch loads, and the settling of its batch copies.

``HostTier`` (``tiers/host.py``) builds on it: ``load_rows`` (a ``SlabMemory``:
each batch's units copied into rows of the device pool, one scatter per part)
and ``load_parts`` (any memory: into parts given per entry), each batch one
transfer and all of a call's batches one job. A load given the ``PinBatch``
that pinned exactly its keys (``LedgerTier.pin_batch``, in the same order)
reads each entry's buffer off the pinned ledger entries (``EntryInfo.where``)
and its settling unpins those entries, so a hit's units are looked up once,
when they are pinned, not again at the copy and at the unpin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from itertools import chain
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, cast

from hybridkv.tiers.base import CopyClock, CopyStats, Parts, UnitKey
from hybridkv.tiers.copier import Copier
from hybridkv.tiers.ledger import EntryInfo, PinBatch
from hybridkv.tiers.ledger_tier import LedgerTier
from hybridkv.tiers.memory import HostMemory, RowMemory
from hybridkv.tiers.transfer import Completed, Completion, Transfer

if TYPE_CHECKING:
    from hybridkv.tiers.rows import Rows

#: An entry's slot, and its parts' sizes (``HostTier._entries``' values).
_SLOT, _SIZES = itemgetter(0), itemgetter(1)
#: A ledger entry's ``(buffer, sizes)`` (``EntryInfo.where``).
_WHERE = attrgetter("where")
#: A batch copy, ready to start on the tier's copier, its bytes, and the batches
#: (of ``CopyCounts``) it copies.
Plan = tuple[Callable[[Copier], Completion], int, int]


class HostLoads(LedgerTier):
    """The batch loads of ``HostTier`` (module docstring); it sets the state below."""

    _memory: HostMemory
    _entries: dict[UnitKey, tuple[Any, tuple[int, ...]]]  # key -> (buffer, sizes)
    #: Batch copies (``store_rows`` / ``load_rows`` ...): bytes and seconds.
    copies: CopyStats

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

    def load_rows(
        self,
        batches: Sequence[tuple[Sequence[UnitKey], Rows]],
        wake: bool = True,
        pins: PinBatch | None = None,
    ) -> list[Transfer]:
        """Copy each batch's ``keys[k]`` entry into row ``k`` of its ``Rows``: one
        transfer and one job for all the batches (each batch's item of the list
        is that transfer: one settle, one unpin pass; a failed copy fails every
        batch, whose units are then recomputed, never read), one row copy per
        batch. Every key must be held (``KeyError`` otherwise, nothing pinned): pin
        them first when anything may evict them meanwhile. ``pins``: a
        ``pin_batch`` of exactly these keys, whose pins the transfer takes over
        (no second pin, no unpin). ``wake=False``: the copy thread is not woken
        for the job (``ThreadCopier.queue``): it runs when the transfer is waited
        for, or at ``wake()``; for a caller that waits at once, or wakes the tier
        itself."""
        self._check_open()
        slab = self._slab()
        clock = CopyClock(1)
        with self._lock:
            every, looked = self._lookup(batches, pins, "load_rows")
            jobs: list[tuple[list[Any], Rows]] = []
            nbytes = 0
            for (keys, rows), found in zip(batches, looked, strict=True):  # (C-level maps)
                if not keys:
                    continue
                sizes = rows.sizes
                if set(map(_SIZES, found)) - {sizes}:
                    bad = next(e[1] for e in found if e[1] != sizes)
                    raise ValueError(f"an entry has parts of {bad}, the rows {sizes}")
                jobs.append((list(map(_SLOT, found)), rows))
                nbytes += sum(sizes) * len(keys)
            plan = (partial(slab.load_rows, jobs), nbytes, len(jobs)) if jobs else None
            (transfer,) = self._start_loads([(every, None)], [plan], wake, pins, clock, every)
            return [transfer] * len(batches)

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
            planned: list[Plan | None] = []
            for keys, into in batches:
                if len(into) != len(keys):
                    raise ValueError(f"{len(keys)} keys and {len(into)} into")
            every, looked = self._lookup(batches, pins, "load_parts")
            for (keys, into), found in zip(batches, looked, strict=True):
                nbytes = sum(map(sum, map(_SIZES, found)))
                start = self._memory.plan_load_many(found, into)
                planned.append((start, nbytes, 1) if keys else None)
            return self._start_loads(batches, planned, wake, pins, clock, every)

    def _lookup(
        self, batches: Sequence[tuple[Sequence[UnitKey], Any]], pins: PinBatch | None, what: str
    ) -> tuple[list[UnitKey], list[list[tuple[Any, tuple[int, ...]]]]]:
        """Every key of the batches, and each batch's entries' ``(buffer, sizes)``:
        read off ``pins``' entries when it pinned exactly these keys in this order
        (the caller's case: no lookup per key), else looked up (``_found``). Under
        the lock."""
        every = list(chain.from_iterable(keys for keys, _ in batches))
        if pins is None or pins.released or pins.keys != every:
            return every, [self._found(keys, what) for keys, _ in batches]
        wheres = list(map(_WHERE, pins.entries))
        out, at = [], 0
        for keys, _ in batches:
            out.append(wheres[at : at + len(keys)])
            at += len(keys)
        return every, out

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
        planned: list[Plan | None],
        wake: bool,
        pins: PinBatch | None,
        clock: CopyClock,
        every: list[UnitKey],
    ) -> list[Transfer]:
        """Pin the batches' keys (``every``, in order; or take ``pins`` over) and
        start each batch's planned copy (None: an empty batch) as one transfer, all
        in one job; each transfer's settling unpins its entries (those of ``pins``
        when it holds them in this order: no lookup per key). Under the lock."""
        self._pin_loads(every, pins)
        held = pins.entries if pins is not None and pins.keys == every else None
        out: list[Transfer] = []
        at = 0
        try:
            with self._copier.collect(wake):
                for (keys, _), plan in zip(batches, planned, strict=True):
                    if plan is None:
                        out.append(Transfer(None, "load", Completed(), keys=()))
                        clock.remaining -= 1
                        continue
                    n, at = len(keys), at + len(keys)
                    mine = None if held is None else held[at - n : at]
                    settle = self._batch_settler(False, plan[1], clock, mine, plan[2])
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
        self,
        store: bool,
        nbytes: int,
        clock: CopyClock,
        pinned: list[EntryInfo] | None = None,
        batches: int = 1,
    ) -> Callable[[Transfer], None]:
        """``pinned``: a load's entries, unpinned as they are (else by key);
        ``batches``: the row batches it copies (``CopyCounts.batches``)."""

        def settle(transfer: Transfer) -> None:
            self._settle_batch(transfer, store, nbytes, clock, pinned, batches)

        return settle

    def _settle_batch(
        self,
        transfer: Transfer,
        store: bool,
        nbytes: int,
        clock: CopyClock,
        pinned: list[EntryInfo] | None,
        batches: int,
    ) -> None:
        with self._lock:
            clock.remaining -= 1
            seconds = None if clock.remaining else clock.elapsed()
            self._in_flight.discard(transfer)
            ledger, n, ok = self._ledger, len(transfer.keys), transfer.error is None
            if pinned is not None:
                ledger.unpin_entries(pinned)
            elif not store:
                ledger.unpin_many(transfer.keys)
            else:
                for key in transfer.keys:
                    if ok:
                        ledger.commit(key)
                    else:
                        ledger.remove(key)
                        self._drop(key)
            if ok:
                (self.copies.store if store else self.copies.load).add(nbytes, seconds, batches)
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
