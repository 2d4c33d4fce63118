"""``TieredCache``: a host-RAM tier (and a disk tier under it) below the device pool.

Two sides, one file each: ``Demotion`` (``demotion.py``) stores what the
pool is about to reuse in the host tier (what the host evicts goes to the
disk tier), and ``Loads`` (``loading.py``) restores a waiting request's tier
hit onto the device before its prefix lookup. Each tier ranks by value per
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
from hybridkv.offload.tier_events import TierEvents
from hybridkv.tiers import DiskTier, HostTier


class TieredCache:
    """The tiers of one engine's device pool (module docstring)."""

    def __init__(
        self,
        manager: KVCacheManager,
        block_bytes: BlockBytes,
        host: HostTier,
        disk: DiskTier | None = None,
    ) -> None:
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
        self.stats = OffloadStats()
        #: The tiers' KV events (each tier a ``medium``), when the pool's are on.
        self.events = TierEvents(self.pool) if self.pool.enable_kv_cache_events else None
        self.demotion = Demotion(
            self.pool, self.policy, block_bytes, host, disk, self.events, self.stats
        )
        self.loads = Loads(manager, block_bytes, host, disk, self.events, self.stats)
        self.pool.on_take = self.demotion.demote
        manager.coordinator.other_holders.append(self.loads.held)
        if disk is not None:
            host.spill = self.demotion.spill
        if self.events is not None:
            events = self.events
            host.on_removed = lambda key: events.removed(key, "CPU")
            if disk is not None:
                disk.on_removed = lambda key: events.removed(key, "DISK")

    def prepare(self, request: Request, wait: bool) -> bool:
        """``Loads.prepare``: False while ``request``'s tier loads are in flight
        and ``wait`` is False; True once its prefix lookup may go ahead."""
        return self.loads.prepare(request, wait)

    def release(self, request: Request) -> None:
        """``Loads.release``: land an aborted request's loads, let go of its blocks."""
        self.loads.release(request)

    def persist(self) -> None:
        """Write the device's cached blocks and the host's entries to the disk tier."""
        self.demotion.persist()

    def close(self) -> None:
        """Persist (with a disk tier), then close the tiers. Idempotent."""
        if self.pool.on_take is None:
            return
        try:
            self.persist()
        finally:  # the tiers close (the disk folder's lock freed) whatever happened
            self.pool.on_take = None
            self.host.close()
            if self.disk is not None:
                self.disk.close()

    def check_integrity(self) -> None:
        """Each tier's invariants; every held block is in use and not free."""
        self.host.check_integrity()
        if self.disk is not None:
            self.disk.check_integrity()
        if self.events is not None:
            self.events.check_integrity()
        self.loads.check_integrity()
