"""``TierStore``: a store of *hit units* below the device pool (host RAM, disk).

A hit unit is what one KV cache group needs to restore one cached block of a
request: its pages (full attention), or the blocks of the window / chunk a hit
reads (sliding, chunked), or the Mamba state at that point. A tier stores each
unit as a few byte *parts* and knows nothing of what they mean.

Keys: ``UnitKey(block_hash, group_id)`` within one ``ModelFingerprint`` (a
tier serves one fingerprint; the disk tier writes it into every entry and
never serves another's). ``block_hash`` is the chained block hash of
``hybridkv.core.hashing``: block 0's hash includes the request's ``cache_salt``
(extra key ``S``) and every later hash includes its parent's, so every key of a
salted request carries the salt and a salted entry is never a hit for another
salt or for none. The LoRA name and multimodal inputs enter the chain the same
way. With ``hash_algo="xxhash"`` (not collision-resistant) the caller must
compare the tokens, as the block pool does on a device hit.

Transfers are asynchronous: ``store`` and ``load`` return a ``Transfer`` at
once; an entry is served only once its store has completed, and an entry with
a transfer in flight (or pinned by ``pin``) is never evicted. A failed load is
a miss for the caller (it recomputes); a failed store leaves nothing behind.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.transfer import Transfer

logger = logging.getLogger("hybridkv.tiers")


class UnitKey(NamedTuple):
    """One hit unit: a chained block hash (salt included) and a KV cache group."""

    block_hash: bytes
    group_id: int


class TierError(ValueError):
    """A tier cannot be used as configured (the message names the setting and the fix)."""


class TierFullError(OSError):
    """A store was skipped: the tier's budget (or its device) has no room for it."""


class CorruptEntryError(OSError):
    """An entry failed its header or checksum check: it was removed, the load is a miss."""


@dataclass(slots=True)
class TierStats:
    """Counters of one tier (monotonic; ``/metrics`` will export them)."""

    stores: int = 0  # completed stores
    store_skips: int = 0  # no room (budget or device full)
    spare_skips: int = 0  # spare-room stores with no spare room (``tiers/spare.py``)
    store_failures: int = 0  # I/O or copy errors (nothing kept)
    loads: int = 0  # completed loads
    load_failures: int = 0  # failed loads (corrupt entries included)
    misses: int = 0  # load() of a key not held
    evictions: int = 0  # entries dropped to make room or by evict()
    corrupt_removed: int = 0  # entries removed by a header or checksum check
    leftovers_removed: int = 0  # temporary files of interrupted writes removed

    def as_dict(self) -> dict[str, int]:
        """Field name -> count."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class CopyCounts:
    """Row-batch copies one way: batches (one per group), bytes, calls, and the
    wall seconds from each call to the landing of its last copy (ledger work
    and the thread hand-off included; a call whose last transfer failed is not
    timed). Wall time only: no CPU clock is read on this path (``CopyClock``)."""

    batches: int = 0
    bytes: int = 0
    calls: int = 0
    seconds: float = 0.0

    def add(self, nbytes: int, seconds: float | None, batches: int = 1) -> None:
        """``batches`` landed with ``nbytes`` in all; ``seconds``: their call's wall
        time, when they were the call's last."""
        self.batches += batches
        self.bytes += nbytes
        if seconds is not None:
            self.calls += 1
            self.seconds += seconds


@dataclass(slots=True)
class CopyStats:
    """A host tier's batch copies (``HostTier.store_rows`` / ``load_rows`` / ``load_parts``)."""

    load: CopyCounts = field(default_factory=CopyCounts)
    store: CopyCounts = field(default_factory=CopyCounts)
    #: Which copy moves the row batches (``RowCopy.name``: ``native`` / ``numpy``);
    #: None over a memory that copies no rows.
    row_copy: str | None = None


class CopyClock:
    """When a host tier's batch call began (``HostTier.store_rows`` / ``load_rows`` /
    ``store_parts`` / ``load_parts``), and how many of its transfers are not settled.

    Wall time (``perf_counter``, no system call) only: a CPU clock
    (``process_time``) is a system call, and on a shared machine the kernel took
    it as the point to switch to other work, stalling a hit's load by 2-14 ms in
    about half the hits (benchmarks/results/tiers-ttft.md, 2026-11-28 "pins")."""

    __slots__ = ("remaining", "started")

    def __init__(self, transfers: int) -> None:
        self.started = time.perf_counter()
        self.remaining = transfers

    def elapsed(self) -> float:
        """Wall seconds since the call."""
        return time.perf_counter() - self.started


#: A unit's parts: bytes-like objects (``HostTier`` with ``TorchHostMemory``: tensors).
Parts = Sequence[Any]


class TierStore(ABC):
    """A byte-budgeted store of hit units (module docstring).

    Contract: ``used_bytes <= budget_bytes`` at every moment; ``contains`` is
    True only for entries whose store completed; ``load`` of such an entry
    returns a transfer whose result is the parts stored, or fails (a miss);
    entries pinned, or with a transfer in flight, are never evicted.
    """

    #: The KV events ``medium`` of this tier ("CPU", "DISK", "STORE").
    medium: str = ""
    fingerprint: ModelFingerprint
    stats: TierStats
    _closed: bool = False
    _warned: set[str]  # what ``_warn_once`` said (each tier makes its own set)

    def _warn_once(self, what: str, message: str) -> None:
        """Log ``message`` the first time this tier meets ``what`` (later ones are counted)."""
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(message)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the {self.medium} tier is closed")

    @property
    @abstractmethod
    def budget_bytes(self) -> int:
        """The most bytes this tier holds."""

    @property
    @abstractmethod
    def used_bytes(self) -> int:
        """Bytes held or reserved by stores in flight."""

    @abstractmethod
    def contains(self, key: UnitKey) -> bool:
        """True when ``key`` can be loaded now (its store completed)."""

    def store(self, key: UnitKey, parts: Parts, value: float | None = None) -> Transfer:
        """Copy ``parts`` in as ``key``'s entry, asynchronously. ``value``: what a
        hit on it saves (for a caller-supplied ranking). A store that finds no
        room completes at once with a ``TierFullError``; one of a key already
        held (or in flight) completes at once and changes nothing."""
        return self.store_many([(key, parts, value)])[0]

    def load(self, key: UnitKey, into: Sequence[Any] | None = None) -> Transfer | None:
        """Copy ``key``'s parts out (into ``into`` when given), asynchronously;
        None when ``key`` is not held (a miss)."""
        return self.load_many([(key, into)])[0]

    @abstractmethod
    def store_many(self, items: Sequence[tuple[UnitKey, Parts, float | None]]) -> list[Transfer]:
        """``store`` of each ``(key, parts, value)`` (a tier may run them as one batch)."""

    @abstractmethod
    def load_many(
        self, items: Sequence[tuple[UnitKey, Sequence[Any] | None]]
    ) -> list[Transfer | None]:
        """``load`` of each ``(key, into)`` (a tier may run them as one batch)."""

    def contains_many(self, keys: Sequence[UnitKey]) -> list[bool]:
        """``contains`` of each key (a remote tier answers in one request)."""
        return [self.contains(k) for k in keys]

    @abstractmethod
    def pin(self, key: UnitKey) -> None:
        """Keep ``key`` from eviction until ``unpin`` (counted; KeyError if not held)."""

    @abstractmethod
    def unpin(self, key: UnitKey) -> None:
        """Undo one ``pin``."""

    @abstractmethod
    def evict(self, key: UnitKey) -> bool:
        """Drop ``key`` now; False when it is pinned or in flight (nothing changes)."""

    @abstractmethod
    def poll(self) -> None:
        """Settle every transfer that has completed (pins released, stats counted)."""

    @abstractmethod
    def keys(self) -> list[UnitKey]:
        """The keys ``contains`` answers True for."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Assert the invariants: bytes accounted, budget kept, pins consistent."""

    @abstractmethod
    def close(self) -> None:
        """Wait for transfers in flight and release threads, files and locks."""
