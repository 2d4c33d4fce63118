"""``LedgerTier``: the bookkeeping every tier shares; a tier adds where bytes live.

It runs ``TierStore``'s contract on an ``EntryLedger``: ``store`` reserves
room (evicting by the ledger's order) and starts the copy, ``load`` pins the
entry and starts the copy out, and each transfer's settling commits, aborts or
unpins. A subclass implements four hooks: ``_measure`` (what an entry of these
parts costs), ``_begin_store`` / ``_begin_load`` (start the copy, return its
completion), ``_drop`` (free an entry's storage), plus ``_check_storage``.

Threads: public methods run in the caller's thread; a transfer may settle on
the copy thread. Both take the tier's lock; the tier never calls into a
transfer while holding it (``Transfer._settle``'s note).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from itertools import compress
from typing import Any

from hybridkv.tiers.base import (
    Parts,
    TierFullError,
    TierStats,
    UnitKey,
)
from hybridkv.tiers.copier import BatchCopier, Copier
from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.key_index import KeyIndex
from hybridkv.tiers.ledger import PinBatch
from hybridkv.tiers.ledger_settling import LedgerSettling
from hybridkv.tiers.ranked_ledger import ledger_for
from hybridkv.tiers.ranking import RankRule
from hybridkv.tiers.spare import is_spare
from hybridkv.tiers.transfer import Completed, Completion, Transfer

#: ``LedgerTier.spill``: an evicted entry's key, parts (copies the callee owns), value.
Spill = Callable[[UnitKey, Sequence[Any], "float | None"], None]


class LedgerTier(LedgerSettling):
    """A ``TierStore`` over an ``EntryLedger`` (module docstring).

    ``spill``: when set, each entry evicted to make room for a store is first
    handed to it (under the tier's lock; a tier that cannot read its entries
    synchronously, ``_read_now``, refuses it): what the host evicts goes to disk.
    """

    spill: Spill | None = None
    #: Called (under the tier's lock) with each committed entry's key as it leaves
    #: the tier: evicted for room, ``evict``-ed, or removed as corrupt; None: nothing.
    on_removed: Callable[[UnitKey], None] | None = None

    def __init__(
        self,
        fingerprint: ModelFingerprint,
        budget_bytes: int,
        copier: Copier,
        ranking: RankRule | None = None,
    ) -> None:
        self.fingerprint = fingerprint
        self.stats = TierStats()
        self._ledger = ledger_for(budget_bytes, ranking, KeyIndex())
        self._copier = BatchCopier(copier)
        self._lock = threading.RLock()
        self._in_flight: set[Transfer] = set()
        self._pins: dict[Hashable, int] = {}  # pin() calls not undone yet
        self._batches: set[PinBatch] = set()  # pin_batch() calls not undone nor taken over
        self._corrupt: set[UnitKey] = set()  # LedgerSettling: found corrupt, still pinned
        self._warned: set[str] = set()
        self._closed = False

    # -- hooks ---------------------------------------------------------------

    @abstractmethod
    def _measure(self, key: UnitKey, parts: Parts) -> tuple[int, tuple[int, ...]]:
        """``(bytes an entry of parts holds in this tier, each part's size)``;
        ``ValueError`` naming a part the tier cannot store."""

    @abstractmethod
    def _begin_store(self, key: UnitKey, parts: Parts, sizes: tuple[int, ...]) -> Completion:
        """Start copying ``parts`` (of ``sizes`` bytes) into ``key``'s storage."""

    @abstractmethod
    def _begin_load(self, key: UnitKey, into: Sequence[Any] | None) -> Completion:
        """Start copying ``key``'s parts out; the completion's result is the parts."""

    def _end_store_batch(self) -> None:
        """After a batch's stores started (inside it): submit a job that runs after
        them and before any of them settles (``DiskTier``: fsync the folder once)."""

    def _read_now(self, key: UnitKey) -> Sequence[Any]:
        """A committed entry's parts, copied now (for ``spill``)."""
        raise NotImplementedError(f"the {self.medium} tier cannot spill its entries")

    @abstractmethod
    def _check_storage(self, keys: set[UnitKey]) -> None:
        """Assert that the storage holds ``keys`` (committed entries) and nothing stale."""

    # -- TierStore -----------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self._ledger.budget_bytes

    @property
    def used_bytes(self) -> int:
        return self._ledger.used_bytes

    def contains(self, key: UnitKey) -> bool:
        with self._lock:
            return self._ledger.is_committed(key)

    def holds_any(self, group_id: int, hashes: Sequence[bytes]) -> bool:
        """True when the tier has an entry (held or in flight) for some
        ``UnitKey(h, group_id)`` of ``hashes``: one set operation, no per-key call.
        False means ``contains`` is False for every one of them."""
        index = self._ledger.index
        assert index is not None
        with self._lock:
            return index.holds_any(group_id, hashes)

    def committed_hashes(self, group_id: int, hashes: Sequence[bytes]) -> set[bytes]:
        """The ``h`` of ``hashes`` for which ``contains(UnitKey(h, group_id))``, under
        one lock and with set operations (``KeyIndex.committed``)."""
        index = self._ledger.index
        assert index is not None
        with self._lock:
            return index.committed(group_id, hashes)

    def keys(self) -> list[UnitKey]:
        with self._lock:
            return list(self._ledger.committed_keys())  # type: ignore[arg-type]

    def store_many(self, items: Sequence[tuple[UnitKey, Parts, float | None]]) -> list[Transfer]:
        """``store`` of each item, the copies run as one job (``BatchCopier``)."""
        self._check_open()
        measured = [(key, parts, value, *self._measure(key, parts)) for key, parts, value in items]
        with self._lock:
            out: list[Transfer] = []
            reserved: list[UnitKey] = []
            try:
                with self._copier.collect():
                    for item in measured:
                        out.append(self._store_one(*item, reserved))
                    if reserved:
                        self._end_store_batch()
            except BaseException:  # nothing of the batch ran: undo its reservations
                for key in reserved:
                    self._ledger.remove(key)
                    self._drop(key)
                raise
            return [self._started(t) for t in out]

    def load_many(
        self, items: Sequence[tuple[UnitKey, Sequence[Any] | None]]
    ) -> list[Transfer | None]:
        """``load`` of each ``(key, into)``, the copies run as one job."""
        self._check_open()
        with self._lock:
            out: list[Transfer | None] = []
            try:
                with self._copier.collect():
                    for key, into in items:
                        out.append(self._load_one(key, into))
            except BaseException:  # nothing of the batch ran: undo its pins
                for t in out:
                    if t is not None:
                        self._ledger.unpin(t.key)
                raise
            return [None if t is None else self._started(t) for t in out]

    def _store_one(
        self,
        key: UnitKey,
        parts: Parts,
        value: float | None,
        nbytes: int,
        sizes: tuple[int, ...],
        reserved: list[UnitKey],
    ) -> Transfer:
        if key in self._ledger:
            self._ledger.store_again(key, value)
            return Transfer(key, "store", Completed())
        error = self._reserve(key, nbytes, value)
        if error is not None:
            return Transfer(key, "store", Completed(None, error))
        try:
            completion = self._begin_store(key, parts, sizes)
        except BaseException:
            self._ledger.remove(key)  # the hook left no storage behind
            raise
        reserved.append(key)
        return Transfer(key, "store", completion, self._settle_store)

    def _reserve(self, key: UnitKey, nbytes: int, value: float | None) -> TierFullError | None:
        """Reserve ``key``'s bytes, evicting (and spilling) what it needs; the error
        (counted, warned once) when there is no room. Under the lock."""
        victims = self._ledger.reserve(key, nbytes, value)
        if victims is None and is_spare(value) and nbytes <= self.budget_bytes:
            # Offered for spare room only and there is none: expected, not warned.
            self.stats.spare_skips += 1
            return TierFullError(f"{self.medium} tier: no spare room for {nbytes} bytes")
        if victims is None:
            self.stats.store_skips += 1
            why = (
                f"larger than the tier's budget of {self.budget_bytes} bytes"
                if nbytes > self.budget_bytes
                else f"{self.used_bytes} of {self.budget_bytes} bytes used, the rest pinned"
            )
            error = TierFullError(f"{self.medium} tier: no room for {nbytes} bytes ({why})")
            self._warn_once("full", f"{error}; store skipped (further skips are counted)")
            return error
        for info in self._ledger.evicted:
            if self.spill is not None and not info.spare:  # a spare entry goes no lower
                self.spill(info.key, self._read_now(info.key), info.value)  # type: ignore[arg-type]
            self._drop(info.key)  # type: ignore[arg-type]
            if self.on_removed is not None:
                self.on_removed(info.key)  # type: ignore[arg-type]
        self.stats.evictions += len(victims)
        return None

    def _load_one(self, key: UnitKey, into: Sequence[Any] | None) -> Transfer | None:
        if not self._ledger.is_committed(key):
            self.stats.misses += 1
            return None
        self._ledger.pin(key)
        try:
            completion = self._begin_load(key, into)
        except BaseException:
            self._ledger.unpin(key)
            raise
        self._ledger.touch(key)
        return Transfer(key, "load", completion, self._settle_load)

    def touch(self, keys: Sequence[UnitKey]) -> list[bool]:
        """Mark each committed entry used (the ledger's LRU order), as a store of a
        held key does; per key, True if the tier holds it or is storing it."""
        with self._lock:
            out = []
            for key in keys:
                known = key in self._ledger
                if known and self._ledger.is_committed(key):
                    self._ledger.touch(key)
                out.append(known)
            return out

    def pin(self, key: UnitKey) -> None:
        with self._lock:
            if not self._ledger.is_committed(key):
                raise KeyError(f"pin of {key!r}, which the {self.medium} tier does not hold")
            self._ledger.pin(key)
            self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: UnitKey) -> None:
        with self._lock:
            if key not in self._ledger:
                raise KeyError(f"unpin of {key!r}, which the {self.medium} tier does not hold")
            n = self._pins.get(key, 0)
            if n == 0:
                raise ValueError(f"unpin of {key!r}, which no pin() holds")
            self._ledger.unpin(key)
            if n == 1:
                del self._pins[key]
            else:
                self._pins[key] = n - 1
            if self._corrupt:
                self._remove_corrupt()

    def pin_batch(self, keys: Sequence[UnitKey]) -> PinBatch:
        """``pin`` each of ``keys`` the tier holds (and ``touch`` it: a load is a
        use), under one lock; the batch names them. Undo it with ``unpin_batch``,
        or hand it to a load that takes its pins over (``HostTier.load_rows``)."""
        with self._lock:
            self._check_open()
            found = self._ledger.pin_entries(keys)
            pinned = list(filter(None, found))  # (an entry is always true)
            every = len(pinned) == len(keys)  # the common case
            held = [True] * len(keys) if every else [e is not None for e in found]
            batch = PinBatch(list(compress(keys, held)), held, pinned)
            self._batches.add(batch)
            return batch

    def unpin_batch(self, batch: PinBatch) -> None:
        """Undo ``pin_batch`` (``ValueError`` if undone or taken over already)."""
        with self._lock:
            self._take_batch(batch)
            self._ledger.unpin_entries(batch.entries)
            if self._corrupt:
                self._remove_corrupt()

    def _take_batch(self, batch: PinBatch) -> None:
        """Forget ``batch`` as held (under the lock): its pins are released or taken over."""
        if batch not in self._batches:
            raise ValueError(f"a pin batch of {len(batch.keys)} keys this tier does not hold")
        self._batches.discard(batch)
        batch.released = True

    def evict(self, key: UnitKey) -> bool:
        with self._lock:
            if not self._ledger.removable(key):
                return False
            self._ledger.remove(key)
            self._drop(key)
            self.stats.evictions += 1
            if self.on_removed is not None:
                self.on_removed(key)
            return True

    def wake(self) -> None:
        """Start the copies queued without waking the copy thread (``load_rows(wake=False)``)."""
        self._copier.wake()

    def poll(self) -> None:
        with self._lock:
            pending = list(self._in_flight)
        for transfer in pending:  # outside the lock: settling takes it
            transfer.done()

    def check_integrity(self) -> None:
        with self._lock:
            self._ledger.check_integrity()
            # Each entry's pins: its pin() calls + its transfers not settled yet.
            expected: Counter[Hashable] = Counter(self._pins)
            for batch in self._batches:
                expected.update(batch.keys)
            # (A transfer leaves _in_flight and releases its pin in one step, under the lock.)
            expected.update(k for t in self._in_flight for k in t.keys)
            for k in self._ledger.pinned_keys() | set(expected):
                entry = self._ledger.get(k)
                assert entry is not None, f"pins on an entry the tier does not hold: {k!r}"
                assert entry.pins == expected[k], (
                    f"{k!r}: {entry.pins} pins, {expected[k]} expected"
                )
            for k in self._corrupt:  # removed by the unpin that frees it (LedgerSettling)
                entry = self._ledger.get(k)
                assert entry is not None and entry.pins > 0, f"{k!r}: corrupt, not removed"
            self._check_storage(set(self._ledger.committed_keys()))  # type: ignore[arg-type]

    def close(self) -> None:
        if self._closed:
            return
        self._copier.close()  # runs every job still queued
        with self._lock:
            pending = list(self._in_flight)
        for transfer in pending:
            transfer.wait()
        self._closed = True
