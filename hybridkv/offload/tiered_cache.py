"""``TieredCache``: a host-RAM tier (and a disk tier under it) below the device pool,
and a store shared by replicas under them (or alone).

Three sides, one file each: ``Demotion`` (``demotion.py``) stores what the
pool is about to reuse in the host tier (what the host evicts goes to the
disk tier), ``StoreWrites`` (``store_writes.py``) writes what requests free to
the shared store, and ``Loads`` (``loading.py``) restores a waiting request's
tier hit onto the device before its prefix lookup, from whichever tier holds
each unit (host, then disk, then the store). Each tier ranks by value per
byte under ``hybrid`` (``CachePolicy.ranks_tiers``), by plain LRU under
``lru``. ``close`` writes the device's cached blocks and the host tier's
entries to the disk tier (when there is one), so a restarted engine hits them.
"""

from __future__ import annotations

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.demotion import Demotion
from hybridkv.offload.loading import Loads
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.store_writes import StoreWrites
from hybridkv.offload.tier_events import TierEvents
from hybridkv.tiers import DiskTier, HostTier, MooncakeTier


class TieredCache:
    """The tiers of one engine's device pool (module docstring)."""

    def __init__(
        self,
        manager: KVCacheManager,
        block_bytes: BlockBytes,
        host: HostTier | None,
        disk: DiskTier | None = None,
        store: MooncakeTier | None = None,
    ) -> None:
        if host is None and (disk is not None or store is None):
            raise ValueError("a TieredCache needs a host tier, or a store alone")
        if not manager.enable_caching:
            raise ValueError("kv_offloading_size needs enable_prefix_caching=True")
        if not manager.hasher.is_cryptographic:
            raise ValueError(
                "kv_offloading_size needs a collision-resistant hash_algo ('sha256'): "
                "a tier hit is not checked token by token"
            )
        self.manager = manager
        self.pool = manager.block_pool
        self.policy = manager.policy
        self.block_bytes = block_bytes
        self.host = host
        self.disk = disk
        self.store = store
        self.stats = OffloadStats()
        #: The tiers' KV events (each tier a ``medium``), when the pool's are on.
        self.events = TierEvents(self.pool) if self.pool.enable_kv_cache_events else None
        self.demotion = None
        if host is not None:
            self.demotion = Demotion(
                self.pool, self.policy, block_bytes, host, disk, self.events, self.stats
            )
            self.pool.on_take = self.demotion.demote
        self.loads = Loads(manager, block_bytes, host, disk, self.events, self.stats, store)
        manager.coordinator.other_holders.append(self.loads.held)
        self.store_writes = None
        if store is not None:
            self.store_writes = StoreWrites(
                self.policy, block_bytes, store, self.events, self.stats
            )
            self.pool.on_free = self.store_writes.on_free
        if host is not None and disk is not None:
            host.spill = self.demotion.spill  # type: ignore[union-attr]
        if self.events is not None:
            events = self.events
            if host is not None:
                host.on_removed = lambda key: events.removed(key, "CPU")
            if disk is not None:
                disk.on_removed = lambda key: events.removed(key, "DISK")
        self._open = True

    def prepare(self, request: Request, wait: bool) -> bool:
        """``Loads.prepare``: False while ``request``'s tier loads are in flight
        and ``wait`` is False; True once its prefix lookup may go ahead."""
        if self.store_writes is not None:
            self.store_writes.settle()
        return self.loads.prepare(request, wait)

    def release(self, request: Request) -> None:
        """``Loads.release``: land an aborted request's loads, let go of its blocks."""
        self.loads.release(request)

    def persist(self) -> None:
        """Write the device's cached blocks and the host's entries to the disk tier."""
        if self.demotion is not None:
            self.demotion.persist()

    def close(self) -> None:
        """Persist (with a disk tier), wait for the store's writes, then close the
        tiers. Idempotent."""
        if not self._open:
            return
        self._open = False
        try:
            self.persist()
            if self.store_writes is not None:
                self.store_writes.settle(wait=True)
        finally:  # the tiers close (the disk folder's lock freed) whatever happened
            self.pool.on_take = None
            self.pool.on_free = None
            for tier in (self.host, self.disk, self.store):
                if tier is not None:
                    tier.close()

    def check_integrity(self) -> None:
        """Each tier's invariants; every held block is in use and not free."""
        for tier in (self.host, self.disk, self.store):
            if tier is not None:
                tier.check_integrity()
        if self.store_writes is not None:
            self.store_writes.check_integrity()
        if self.events is not None:
            self.events.check_integrity()
        self.loads.check_integrity()
