"""``MooncakeTier``: hit units in a Mooncake Store that every replica shares.

An entry is one store object named ``hkv1/<fingerprint hex[:32]>/g<group>/<block
hash hex>``, whose bytes are an ``entry_file`` entry: a header (the model
fingerprint's digest, the key, the part sizes, an xxh3-128 checksum of every
byte) and the parts. Two models, dtypes or layouts never share a name, and every
load checks the header and checksum anyway: an object of another fingerprint or
key, or with a flipped byte, is a failed load (a miss, recomputed) and is
removed and counted (``corrupt_removed``).

- **Objects travel through registered memory** (``store_io.py``; URL field
  ``zerocopy``, on by default): a write is assembled (header + parts) in the
  staging region by one copy from the pool rows and put from there; a load is
  read into it, checked there, then copied into ``into`` (``store_reads.py``).
- **Writes never delay a step.** ``store_many`` builds each unit's object at
  once (the block may be reused as soon as it returns) and hands the batch to
  the write thread (with ``send=False``: at the next ``send``, all held batches
  as one; ``store_held.py``), which asks which objects the store already has
  (one ``batch_is_exist``) and puts the others (one ``batch_put_from``). Past
  ``queue_bytes`` waiting (the staging's write part), or with no free range
  that long, a store is skipped (``TierFullError``, counted), never waited for.
- **The store evicts, not us.** A put the store has no room for (its
  ``NO_AVAILABLE_HANDLE``) is skipped and counted (``store_skips``); the store
  frees room by its own rule (leases, watermark); what it dropped is a miss.
- **Reads** run on their own thread (never behind writes): one ``batch_get_into``
  per ``load_many`` (in rounds if the read staging cannot hold it), each object
  checked, then copied into ``into``. An object gone, or larger than the whole
  read staging (``store_stats.staging_misses``), is a failed load (a miss).
- **Lookups** (``contains_many``) are one ``batch_is_exist``. The store may drop
  an entry between a lookup and its load: that load then fails (recompute).
- **Its evictions are watched** (``store_watch.py``): an object this tier wrote
  and saw land that a lookup, a load, a write or the periodic sweep (``sweep``
  seconds, one ``batch_is_exist`` of ``SWEEP_KEYS`` keys) finds missing is
  reported by ``take_gone`` (the engine's ``BlockRemoved``), lazily.
- **Outages** (``StoreClient``): while the master is unreachable, lookups say
  no, loads fail and stores are skipped at once, with one warning per outage.

``budget_bytes`` / ``used_bytes`` are the write queue's (the store's capacity
is the sum of the segments its replicas lend). ``pin`` is a local count: the
store does not know it (a pinned entry may go; its load then fails). ``keys()``:
the entries this tier wrote, saw land and has not found gone (``_REMEMBERED``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hybridkv.tiers import entry_file
from hybridkv.tiers.base import (
    CorruptEntryError,
    Parts,
    TierFullError,
    TierStats,
    TierStore,
    UnitKey,
)
from hybridkv.tiers.batch_item import BatchItem, Outcome
from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.memory import byte_view
from hybridkv.tiers.store_client import OK, StoreClient, put_error
from hybridkv.tiers.store_held import HeldPuts
from hybridkv.tiers.store_io import Staged, store_io
from hybridkv.tiers.store_reads import read_batch
from hybridkv.tiers.store_stats import StoreStats
from hybridkv.tiers.store_url import parse_store_url
from hybridkv.tiers.store_watch import StoreWatch
from hybridkv.tiers.transfer import Completed, Transfer

#: Object names start with this (a change of the entry format changes it).
NAME_PREFIX = "hkv1"
#: How many landed keys ``keys()`` remembers (the oldest are forgotten first).
_REMEMBERED = 1 << 16


class MooncakeTier(TierStore):
    """Hit units in a shared Mooncake Store (module docstring)."""

    medium = "STORE"
    #: ``contains`` asks over the network: callers batch lookups (``contains_many``).
    remote = True

    def __init__(
        self,
        fingerprint: ModelFingerprint,
        client: StoreClient,
        queue_bytes: int,
        owns_client: bool = True,
        sweep: float = 0.0,
        zero_copy: bool | None = None,
    ) -> None:
        """``owns_client``: ``close`` closes ``client`` too (leaving the store takes
        the client 1-2 s); False for tiers of several fingerprints on one client.
        ``sweep``: seconds between sweeps of the watched keys (0: none).
        ``zero_copy``: through staging memory (``store_io``; None: the URL's ``zerocopy``):
        ``queue_bytes`` for writes, the URL's ``staging`` for reads; ``close`` frees it."""
        self.fingerprint = fingerprint
        self.client = client
        self._owns_client = owns_client
        self.stats = TierStats()
        self.store_stats = StoreStats()
        self._digest = fingerprint.digest
        self._prefix = f"{NAME_PREFIX}/{fingerprint.hex[:32]}/"
        self._queue_bytes = queue_bytes
        self._queued = 0
        self._lock = threading.Lock()
        self._in_flight: set[Transfer] = set()
        self._queue: dict[BatchItem, int] = {}  # stores on the write thread -> their bytes
        self._pins: Counter[UnitKey] = Counter()
        self._watch = StoreWatch(client, self.name, self.store_stats, _REMEMBERED, sweep)
        self._warned: set[str] = set()
        self._held = HeldPuts()
        zc = client.url.zerocopy if zero_copy is None else zero_copy
        self.io = store_io(client, zc, queue_bytes, client.url.staging)  # registered now
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="hybridkv-store-put")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="hybridkv-store-get")
        self._closed = False

    @classmethod
    def connect(cls, fingerprint: ModelFingerprint, url: str) -> MooncakeTier:
        """Join the store of a ``kv_store`` URL (``store_url.py``); ``TierError`` naming
        the field or the address when it cannot."""
        parsed = parse_store_url(url)
        return cls(fingerprint, StoreClient.connect(parsed), parsed.queue, sweep=parsed.sweep)

    def name(self, key: UnitKey) -> str:
        """The store object's name of ``key``."""
        return f"{self._prefix}g{key.group_id}/{key.block_hash.hex()}"

    # -- TierStore -------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self._queue_bytes

    @property
    def used_bytes(self) -> int:
        return self._queued

    def contains(self, key: UnitKey) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[UnitKey]) -> list[bool]:
        """``contains`` of each key, in one request."""
        if keys and not self.client.healthy():
            self.store_stats.unreachable += 1
        watched = self._watch.snapshot(keys)
        there = self.client.lookup([self.name(k) for k in keys])
        if watched:
            self._watch.checked(watched, dict(zip(keys, there, strict=True)))
        return [held is True for held in there]

    def keys(self) -> list[UnitKey]:
        return self._watch.keys()

    def take_gone(self) -> list[UnitKey]:
        """The keys this tier wrote and has since found gone from the store (module
        docstring; each once); starts a sweep on the write thread when one is due."""
        gone, due = self._watch.take_gone()
        if due and not self._closed:
            self._writer.submit(self._watch.sweep)
        return gone

    def store_many(
        self, items: Sequence[tuple[UnitKey, Parts, float | None]], send: bool = True
    ) -> list[Transfer]:
        """Build each unit's object now; put the batch on the write thread now, or with
        ``send=False`` at the next ``send`` (module docstring)."""
        self._check_open()
        up = self.client.healthy()
        out: list[Transfer | BatchItem] = []
        batch: list[tuple[UnitKey, Staged]] = []
        with self._lock:
            for key, parts, _ in items:
                if not up:
                    self.store_stats.unreachable += 1
                    out.append(self._skipped(key, "unreachable"))
                    continue
                views = [byte_view(p, f"part {i}") for i, p in enumerate(parts)]
                header = entry_file.entry_header(self._digest, key, views)
                size = len(header) + sum(v.nbytes for v in views)
                staged = None if self._queued + size > self._queue_bytes else self.io.stage(size)
                if staged is None:
                    self.stats.store_skips += 1
                    if self._queued + size <= self._queue_bytes:
                        self.store_stats.staging_skips += 1  # room, but no free range
                    out.append(self._skipped(key, "queue"))
                    continue
                staged.fill(header, views)  # the one copy from the pool rows
                item = BatchItem(len(batch), size)
                self._queued += size
                self._queue[item] = size
                batch.append((key, staged))
                out.append(item)
        if not batch:
            return out  # type: ignore[return-value]  # only skipped stores
        future = self._held.hold(batch)
        transfers: list[Transfer] = []
        for entry in out:
            if isinstance(entry, BatchItem):
                entry.future = future
                key = batch[entry.index][0]
                entry = self._track(Transfer(key, "store", entry, self._settle_store))
            transfers.append(entry)
        if send:
            self.send()
        return transfers

    def send(self) -> None:
        """Put every batch ``store_many(send=False)`` held, as one job on the write thread."""
        held = self._held.take()
        if held:
            self._writer.submit(HeldPuts.run, held, self._put)

    def load_many(
        self, items: Sequence[tuple[UnitKey, Sequence[Any] | None]]
    ) -> list[Transfer | None]:
        """Read the batch on the read thread; each a ``Transfer`` (a missing
        object is a failed load, not None: the store is not asked here)."""
        self._check_open()
        if not items:
            return []
        if not self.client.healthy():
            self.store_stats.unreachable += 1
            self.stats.misses += len(items)
            return [None] * len(items)
        targets = [
            None if into is None else [byte_view(t, f"into[{i}]") for i, t in enumerate(into)]
            for _, into in items
        ]
        keys = [key for key, _ in items]
        with self._lock:
            self._pins.update(keys)  # released as each load settles
        future = self._reader.submit(self._get, keys, targets, [into for _, into in items])
        out: list[Transfer | None] = []
        for i, key in enumerate(keys):
            item = BatchItem(i)
            item.future = future
            out.append(self._track(Transfer(key, "load", item, self._settle_load)))
        return out

    def _track(self, transfer: Transfer) -> Transfer:
        """Keep ``transfer`` for ``poll`` until it settles (settling takes the lock too)."""
        with self._lock:
            if not transfer.settled:
                self._in_flight.add(transfer)
        return transfer

    def pin(self, key: UnitKey) -> None:
        with self._lock:
            self._pins[key] += 1

    def unpin(self, key: UnitKey) -> None:
        with self._lock:
            if self._pins[key] == 0:
                raise ValueError(f"unpin of {key!r}, which no pin() holds")
            self._pins[key] -= 1
            if not self._pins[key]:
                del self._pins[key]

    def evict(self, key: UnitKey) -> bool:
        with self._lock:
            if self._pins[key]:
                return False
        removed = self.client.remove(self.name(key))
        if removed:
            self.stats.evictions += 1
            self._watch.drop(key)
        return removed

    def poll(self) -> None:
        with self._lock:
            pending = list(self._in_flight)
        for t in pending:
            t.done()

    def check_integrity(self) -> None:
        with self._lock:
            queued = sum(self._queue.values())
            assert queued == self._queued, (queued, self._queued)
            assert 0 <= self._queued <= self._queue_bytes, (self._queued, self._queue_bytes)
            loads = Counter(t.key for t in self._in_flight if t.kind == "load")
            for key, n in loads.items():
                assert self._pins[key] >= n, f"{key!r}: a load in flight holds no pin"
            assert all(n > 0 for n in self._pins.values()), "a pin count below 1 is kept"
            self._watch.check_integrity()
        self.io.check_integrity()

    def close(self) -> None:
        """Wait for the writes and reads in flight, unregister and free the staging
        memory, then leave the store (``owns_client``)."""
        if self._closed:
            return
        self.send()
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self.poll()
        self._closed = True
        self.io.close()
        if self._owns_client:
            self.client.close()

    # -- the threads' jobs -----------------------------------------------------

    def _put(self, batch: list[tuple[UnitKey, Staged]]) -> list[Outcome]:
        started = time.perf_counter()
        names = [self.name(key) for key, _ in batch]
        watched = self._watch.snapshot(key for key, _ in batch)
        sizes = [staged.nbytes for _, staged in batch]
        try:
            there = self.client.lookup(names)
            send = [i for i, held in enumerate(there) if held is not True]
            codes = self.io.put([names[i] for i in send], [batch[i][1] for i in send])
        finally:
            self.io.release([staged for _, staged in batch])
        out: list[Outcome] = [(None, None)] * len(batch)
        if watched:  # a watched key missing is gone, unless this put landed it again
            put_back = {batch[i][0] for i, code in zip(send, codes, strict=True) if code == OK}
            answers = {key: there[i] for i, (key, _) in enumerate(batch)}
            self._watch.checked([w for w in watched if w[0] not in put_back], answers)
        for i, code in zip(send, codes, strict=True):
            out[i] = (None, put_error(code))
        with self._lock:
            self.store_stats.put_batches += 1
            self.store_stats.already_there += len(batch) - len(send)
            self.store_stats.put_bytes += sum(
                sizes[i] for i, code in zip(send, codes, strict=True) if code == OK
            )
            self.store_stats.put_seconds.append(time.perf_counter() - started)
        return out

    def _get(
        self,
        keys: list[UnitKey],
        targets: list[list[memoryview] | None],
        intos: list[Sequence[Any] | None],
    ) -> list[Outcome]:
        started = time.perf_counter()
        watched = self._watch.snapshot(keys)
        names = [self.name(k) for k in keys]
        read = read_batch(self.io, self._digest, keys, names, targets, intos)
        for name in read.corrupt:  # useless to every reader: removed before it settles
            self.client.remove(name, force=True)
        with self._lock:
            self.store_stats.get_batches += 1
            self.store_stats.get_bytes += read.nbytes
            self.store_stats.staging_misses += read.no_staging
            self.store_stats.get_seconds.append(time.perf_counter() - started)
        suspects = [w for w in watched if w[0] in read.missing]
        self._watch.ask(suspects)  # a watched key not read: gone, if the store says so
        return read.outcomes

    # -- settling --------------------------------------------------------------

    def _settle_store(self, transfer: Transfer) -> None:
        with self._lock:
            self._in_flight.discard(transfer)
            self._queued -= self._queue.pop(transfer.completion)  # type: ignore[call-overload]
            error = transfer.error
            if error is None:
                self.stats.stores += 1
                self._watch.landed(transfer.key)
            elif isinstance(error, TierFullError):
                self.stats.store_skips += 1
            elif not isinstance(error, ConnectionError):
                self.stats.store_failures += 1
                self._warn_once("put", f"{error}; skipped (further failures are counted)")

    def _settle_load(self, transfer: Transfer) -> None:
        key = transfer.key
        with self._lock:
            self._in_flight.discard(transfer)
            self._pins[key] -= 1
            if not self._pins[key]:
                del self._pins[key]
            if transfer.error is None:
                self.stats.loads += 1
                return
            self.stats.load_failures += 1
            if isinstance(transfer.error, KeyError):
                self.stats.misses += 1
            if not isinstance(transfer.error, CorruptEntryError):
                return
            self.stats.corrupt_removed += 1
            self._watch.drop(key)
            self._warn_once("corrupt", f"STORE tier: {transfer.error}")

    def _skipped(self, key: UnitKey, why: str) -> Transfer:
        if why == "queue":
            error: OSError = TierFullError(
                f"STORE tier: {self._queued} of {self._queue_bytes} queued bytes in use"
            )
            self._warn_once("queue", f"{error}; write skipped (further skips are counted)")
        else:
            error = ConnectionError("STORE tier: the store is unreachable")
        return Transfer(key, "store", Completed(None, error))
