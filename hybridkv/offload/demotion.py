"""``Demotion``: what leaves the device pool goes down the tiers.

Just before the pool reuses free cached blocks (``BlockPool.on_take``), each
block the cache policy finds worth it (``CachePolicy.demotion_value``: under
``hybrid`` the value of the run it was released with; under ``lru`` None,
since it writes through) is stored in the host tier as the unit
``UnitKey(block hash, group)``. The copies out of the runner's KV buffers are
waited for before ``get_new_blocks`` returns, so nothing writes the block
before its bytes are out. What the host tier evicts to make room is written
to the disk tier (``LedgerTier.spill``), and so does a unit the host tier has
no room for (a batch larger than what it can evict). ``persist`` writes the
device's cached blocks and the host's entries to the disk tier (at ``close``).

A block ``hybrid`` released ``evict_first`` (no kept point needs it) is
offered with the value ``SPARE``: the host takes it only into spare room
(its free bytes and older spare units' bytes, never a valued unit's), it is
the host's first victim, and it never goes to the disk tier, neither when the
host has no spare room nor when the host evicts it (``tiers/spare.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.tier_events import TierEvents
from hybridkv.offload.unit_batches import store_units
from hybridkv.offload.unit_reads import UnitReads
from hybridkv.policy.base import CachePolicy
from hybridkv.tiers import DiskTier, HostTier, TierFullError, UnitKey
from hybridkv.tiers.spare import is_spare

logger = logging.getLogger("hybridkv.offload")


class Demotion:
    """The demotion side of a ``TieredCache`` (module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        policy: CachePolicy,
        block_bytes: BlockBytes,
        host: HostTier,
        disk: DiskTier | None,
        events: TierEvents | None,
        stats: OffloadStats,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.block_bytes = block_bytes
        self.reads = UnitReads(block_bytes)
        self.host = host
        self.disk = disk
        self.events = events
        self.stats = stats
        self._spills: list[tuple[UnitKey, list[Any], float | None]] = []

    def demote(self, blocks: list[KVCacheBlock]) -> None:
        """``BlockPool.on_take``: store the cached blocks about to be reused."""
        items = []
        value_of = self.policy.demotion_value
        events = self.events
        if events is not None:
            events.flush()
        for b in blocks:
            h = b.block_hash
            if h is None:
                continue
            value = value_of(b)
            gid = b.group_id
            assert gid is not None
            if value is None:
                if events is not None:
                    events.forget(UnitKey(h, gid), leaving=True)
                continue
            items.append((UnitKey(h, gid), b.block_id, value))
        if not items:
            return
        # Valued units first, spare ones after they have landed: a spare unit in
        # flight is pinned, so in one batch it would make a valued unit evict
        # another valued one in its place.
        spare = [item for item in items if is_spare(item[2])]
        if spare:
            items = [item for item in items if not is_spare(item[2])]
        for batch in (items, spare) if spare else (items,):
            self._store(batch)
        self.flush_spills()
        self.stats.demoted += len(items) + len(spare)

    def _store(self, items: list[tuple[UnitKey, int, float]]) -> None:
        """Store ``(key, block id, value)`` units in the host tier and wait; what
        it has no room for goes to the disk tier (valued units only), read off
        the device as one batch (``UnitReads``)."""
        events = self.events
        if not items:
            return
        units = [(key, block) for key, block, _ in items]
        errors = store_units(self.host, self.block_bytes, units, [v for *_, v in items])
        overflow: list[tuple[UnitKey, int, float]] = []
        for item, error in zip(items, errors, strict=True):  # the blocks are rewritten
            if error is None:
                if events is not None:
                    events.stored(item[0], "CPU")
            elif (
                isinstance(error, TierFullError) and self.disk is not None and not is_spare(item[2])
            ):
                # No room in the host (a batch cannot evict its own entries in
                # flight): the unit goes to the disk tier instead, as a copy.
                overflow.append(item)
                if events is not None:
                    events.queued(item[0])
            elif events is not None:  # in no tier: forget its fields
                events.forget(item[0], leaving=True)
        if overflow:
            read = self.reads.read([(key.group_id, b) for key, b, _ in overflow], own=True)
            for (key, _, value), parts in zip(overflow, read, strict=True):
                self._spills.append((key, parts, value))

    def spill(self, key: UnitKey, parts: Any, value: float | None) -> None:
        """``HostTier.spill``: an entry the host evicts is queued for the disk tier
        (``parts`` are copies; written by ``_flush_spills``, one batch per store)."""
        self._spills.append(
            (key, [p.numpy() if isinstance(p, torch.Tensor) else p for p in parts], value)
        )
        if self.events is not None:
            self.events.queued(key)

    def flush_spills(self) -> None:
        """Write the queued spills to the disk tier as one batch (one folder fsync)."""
        if not self._spills or self.disk is None:
            return
        spills, self._spills = self._spills, []
        try:
            transfers = self.disk.store_many(spills)
            self.stats.spilled += len(spills)
            if self.events is not None:
                for (key, _, _), t in zip(spills, transfers, strict=True):
                    self.events.storing_on_disk(key, t)
        except Exception as e:  # serving goes on without them: count, warn once
            self.stats.spill_failures += len(spills)
            if self.events is not None:
                self.events.unqueued([key for key, _, _ in spills])
            if self.stats.spill_failures == len(spills):
                logger.warning("units evicted from the host tier were not written to disk: %s", e)

    def persist(self) -> None:
        """Write the device's cached blocks and the host's entries to the disk tier."""
        if self.disk is None:
            return
        units: list[tuple[UnitKey, int]] = []
        values: list[float | None] = []
        for gid, index in enumerate(self.pool.cached):
            for h, b in index.items():
                value = self.policy.demotion_value(b) if b.ref_cnt == 0 else 1.0
                if value is not None:
                    units.append((UnitKey(h, gid), b.block_id))
                    values.append(value)
        if units:  # (one transfer per group; what has no room is written below if held)
            store_units(self.host, self.block_bytes, units, values)
        held = self.host.keys()
        for key in held:
            if not self.disk.contains(key):
                out = self.host.load(key)
                if out is not None and out.wait():
                    self.spill(key, out.result, None)
        self.flush_spills()
        if self.events is not None:
            self.events.flush(wait=True)
