"""``StoreWrites``: blocks written to the store that replicas share.

Two moments write (``docs/tiers.md``, "What is written, and when"):

- after each step, the computed blocks that the policy wants shared at once
  (``CachePolicy.store_on_compute``, picked by ``ComputedStores`` in
  ``store_on_compute.py``): another replica hits a prefix while the request
  that computed it still runs;
- when a request lets go of its blocks (``BlockPool.on_free``: finished,
  preempted or aborted; the blocks are computed, cached and free), each one
  the policy finds worth sharing (``CachePolicy.store_value``: under
  ``hybrid`` a run released with a value, never one released
  ``evict_first``; under ``lru`` every block).

Each is written as ``UnitKey(hash, group)``: its bytes are copied at once (into
the store tier's staging memory: one copy from the pool rows) and the store
tier puts them from its own thread, so the step never waits for the network. A
request's free comes in several calls (one per released run): each call's
units are copied at once but held by the store tier (``store_many(send=False)``)
and go out as one batch (one existence check and one put) at the next
``flush`` (``barrier``, any ``settle``, the next step's ``TieredCache.poll``).
Another replica's next turn of the same conversation, or another request on
the same document, then finds it there.

Writes are not repeated: a key written less than ``REWRITE_SECONDS`` ago is
not copied again (at most ``REMEMBERED`` keys; all forgotten when this client
sees the store come back after an outage, since a restarted master holds
nothing). After that it is offered again, because the store may have evicted
it or restarted unseen (an idle replica does not see an outage), and the store
tier does not send an object the store already has. The outcome of each write
is read at the next call: a landed write is a ``BlockStored`` with the store's
medium (KV events on), and a written key the store tier has since found gone
(``MooncakeTier.take_gone``) a ``BlockRemoved``, and may be written again at once.
``barrier`` names the writes in flight, for an output that
waits until what its request wrote is in the store (``write_barrier.py``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from hybridkv.core.block import KVCacheBlock
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.tier_events import TierEvents
from hybridkv.offload.unit_reads import UnitReads
from hybridkv.offload.write_barrier import WriteBarrier
from hybridkv.policy.base import CachePolicy
from hybridkv.tiers import MooncakeTier, Transfer, UnitKey

#: A block's value in the store (None: not written).
Valuation = Callable[[KVCacheBlock], "float | None"]
#: How many keys written recently are remembered (not copied again).
REMEMBERED = 1 << 16
#: How long a written key is not offered again (then the store is asked again: it
#: may have evicted the object, or restarted while this replica was idle).
REWRITE_SECONDS = 10.0


class StoreWrites:
    """The write-through side of the store tier (module docstring)."""

    def __init__(
        self,
        policy: CachePolicy,
        block_bytes: BlockBytes,
        store: MooncakeTier,
        events: TierEvents | None,
        stats: OffloadStats,
    ) -> None:
        self.policy = policy
        self.block_bytes = block_bytes
        self.reads = UnitReads(block_bytes)
        self.store = store
        self.events = events
        self.stats = stats
        self._written: OrderedDict[UnitKey, float] = OrderedDict()  # key -> when, oldest first
        self._epoch = store.client.epoch
        self._pending: list[Transfer] = []
        #: ``REWRITE_SECONDS`` for this engine (a test may shorten it).
        self.rewrite_seconds = REWRITE_SECONDS

    def on_free(self, blocks: list[KVCacheBlock]) -> None:
        """``BlockPool.on_free``: take the freed blocks worth sharing
        (``CachePolicy.store_value``). A request's free comes in several calls (one
        per released run): their bytes are copied now (by the store tier) and sent
        as one batch at the next ``flush``."""
        value_of = self.policy.store_value
        self._send(self._take([(b, value_of) for b in blocks]), send=False)

    def write(self, blocks: list[tuple[KVCacheBlock, Valuation]]) -> None:
        """Write each cached ``(block, valuation)`` whose valuation gives a value
        (None: not written), unless written recently (module docstring): its bytes
        are copied now, the put runs on the store tier's thread."""
        self.settle()
        self._send(self._take(blocks))

    def flush(self) -> None:
        """Send what the frees took since the last flush, as one batch."""
        self.store.send()

    def _take(
        self, blocks: list[tuple[KVCacheBlock, Valuation]]
    ) -> list[tuple[UnitKey, list[Any], float]]:
        """The units to write: each block not written recently whose valuation gives a
        value, with its bytes in host memory, read as one batch (``UnitReads``: views
        of the KV buffers on the CPU, which the store tier copies at once; one pinned
        staging copy and one event on CUDA)."""
        chosen: list[tuple[UnitKey, int, float]] = []
        now = time.monotonic()
        written = self._written
        for b, value_of in blocks:
            h, gid = b.block_hash, b.group_id
            if h is None or gid is None:
                continue
            key = UnitKey(h, gid)
            when = written.get(key)
            if when is not None and now - when < self.rewrite_seconds:
                continue
            value = value_of(b)
            if value is None:
                continue
            chosen.append((key, b.block_id, value))
            written.pop(key, None)
            written[key] = now
            if self.events is not None:
                self.events.queued(key)
        while len(self._written) > REMEMBERED:
            self._written.popitem(last=False)
        parts = self.reads.read([(key.group_id, bid) for key, bid, _ in chosen])
        return [(key, ps, value) for (key, _, value), ps in zip(chosen, parts, strict=True)]

    def _send(self, items: list[tuple[UnitKey, list[Any], float]], send: bool = True) -> None:
        if items:
            self._pending.extend(self.store.store_many(items, send=send))
            self.stats.store_writes += len(items)

    def barrier(self) -> WriteBarrier:
        """The writes in flight now (the frees' sent first): a request that finished
        in the last step hands its output over once they have ended, or after the
        URL's ``finish`` seconds (0: none is waited for; ``write_barrier``)."""
        self.settle()
        finish = self.store.client.url.finish
        return WriteBarrier(self._pending if finish else (), self.stats, finish)

    def settle(self, wait: bool = False) -> None:
        """Send what the frees took (``flush``), then read the writes that ended
        (``wait``: all of them): a landed one is announced; a failed one may be
        written again."""
        self.flush()
        if self.store.client.epoch != self._epoch:  # a restarted master holds nothing
            self._epoch = self.store.client.epoch
            self._written.clear()
        still = []
        for t in self._pending:
            if not (t.wait() if wait else t.done()):
                still.append(t)
                continue
            if t.error is not None:
                self._written.pop(t.key, None)
            if self.events is not None:
                self.events.written_to_store(t.key, t.error is None)
        self._pending = still
        for key in self.store.take_gone():  # after the landings: a removal follows its store
            self._written.pop(key, None)
            if self.events is not None:
                self.events.store_left(key)

    def check_integrity(self) -> None:
        """The remembered keys stay bounded."""
        assert len(self._written) <= REMEMBERED
