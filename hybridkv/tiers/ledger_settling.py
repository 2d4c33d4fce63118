"""``LedgerSettling``: how a ``LedgerTier``'s transfers settle, and entries found corrupt.

A store settles by committing its entry (or removing it, counted as a skip or a
failure); a load by unpinning its entry (counted as a load or a failure). Settling
runs under the tier's lock, on whichever thread completes the transfer
(``LedgerTier``'s module docstring).

*Entries found corrupt* (a load's ``CorruptEntryError``: a header or checksum check)
are removed and counted (``corrupt_removed``) as soon as no pin holds them. A load can
settle while its lookup's pin batch still holds the entry (the batch is released after
the landing, on the scheduler's thread; the load settles inline or on the copy thread,
before or after that), so such an entry waits in ``_corrupt`` and is removed by the
unpin that frees it (``_remove_corrupt``): what is removed does not depend on which
thread came first. Meanwhile it is pinned, so nothing evicts it; a lookup in that
window may still find it, and its load then fails again (counted) and the request
recomputes those tokens: never stale bytes.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable

from hybridkv.tiers.base import CorruptEntryError, TierFullError, TierStats, TierStore, UnitKey
from hybridkv.tiers.ledger import EntryLedger
from hybridkv.tiers.transfer import Transfer


class LedgerSettling(TierStore):
    """The settling half of ``LedgerTier`` (module docstring); it sets the fields."""

    stats: TierStats
    on_removed: Callable[[UnitKey], None] | None
    _ledger: EntryLedger
    _lock: threading.RLock
    _in_flight: set[Transfer]
    _corrupt: set[UnitKey]  # found corrupt, still pinned: removed by the unpin that frees it

    @abstractmethod
    def _drop(self, key: UnitKey) -> None:
        """Free ``key``'s storage (under the lock; the ledger entry is gone)."""

    def _settle_store(self, transfer: Transfer) -> None:
        key = transfer.key
        with self._lock:
            self._in_flight.discard(transfer)
            if transfer.error is None:
                self._ledger.commit(key)
                self.stats.stores += 1
                return
            self._ledger.remove(key)
            self._drop(key)
            if isinstance(transfer.error, TierFullError):
                self.stats.store_skips += 1
            else:
                self.stats.store_failures += 1
            name = type(transfer.error).__name__
            self._warn_once(
                f"store:{name}",
                f"{self.medium} tier: a store failed ({transfer.error}); it was skipped, "
                "nothing of it is kept (further failures are counted)",
            )

    def _settle_load(self, transfer: Transfer) -> None:
        key = transfer.key
        with self._lock:
            self._in_flight.discard(transfer)
            self._ledger.unpin(key)
            if transfer.error is None:
                self.stats.loads += 1
                return
            self.stats.load_failures += 1
            if isinstance(transfer.error, CorruptEntryError):
                if key not in self._corrupt:
                    self.stats.corrupt_removed += 1
                    self._corrupt.add(key)
                self._remove_corrupt()
                self._warn_once("corrupt", f"{self.medium} tier: {transfer.error}")

    def _remove_corrupt(self) -> None:
        """Remove each entry found corrupt that no pin holds any more (under the lock)."""
        ledger = self._ledger
        for key in [k for k in self._corrupt if k not in ledger or ledger.removable(k)]:
            self._corrupt.discard(key)
            if key not in ledger:
                continue  # gone another way already
            self._ledger.remove(key)
            self._drop(key)
            if self.on_removed is not None:
                self.on_removed(key)

    def _started(self, transfer: Transfer) -> Transfer:
        """Track ``transfer`` until it settles. One that no other thread completes
        (inline, a CUDA event) settles now if it is done: only this thread knows it
        yet, so settling under the lock is safe."""
        if not transfer.completion.threaded:
            transfer.done()
        if not transfer.settled:
            self._in_flight.add(transfer)
        return transfer
