"""``TieredCache``: a host-RAM tier (and a disk tier under it) below the device pool,
and a store shared by replicas under them (or alone).

One concern per file, composed here:

- what reaches the host tier is the policy's (``CachePolicy.writes_through``):
  ``WriteThrough`` (``write_through.py``, ``lru``: each block as it is
  computed, as vLLM's ``OffloadingConnector``) or ``Demotion``
  (``demotion.py``, ``hybrid``: what the pool is about to reuse); what the host
  evicts goes to the disk tier;
- ``StoreWrites`` (``store_writes.py``) writes to the shared store what
  requests free (``CachePolicy.store_value``) and, after each step, what
  ``ComputedStores`` (``store_on_compute.py``) picks of the computed blocks
  (``CachePolicy.store_on_compute``), so that another replica hits a prefix
  while its request still runs;
- ``Swap`` (``swap.py``): a preempted request's units stored for its resume
  (with a host tier);
- ``Loads`` (``loading.py``) restores a waiting request's tier hit onto the
  device before its prefix lookup, from whichever tier holds each unit (host,
  then disk, then the store), if ``LoadCost`` (``load_cost.py``) finds
  loading cheaper than recomputing;
- ``PendingStores`` orders a block's reuse after the asynchronous stores still
  reading it, and ``StreamOrder`` orders the step after a copy (on CUDA the
  current stream waits on the copy's event; elsewhere the host waits);
- ``InFlightStep`` (``inflight_step.py``) orders the other way, with async
  scheduling: a copy of device blocks issued while a step is in flight (a
  swap, a demotion, a load into taken blocks, a store of freed blocks,
  ``persist``) runs after that step (``step_launched`` / ``step_landed``).

Each tier ranks by value per byte under ``hybrid`` (``CachePolicy.ranks_tiers``),
by plain LRU under ``lru``. ``close`` writes the device's cached blocks and the
host tier's entries to the disk tier (when there is one), so a restarted
engine hits them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.demotion import Demotion
from hybridkv.offload.inflight_step import Fence, InFlightStep
from hybridkv.offload.load_cost import LoadCost
from hybridkv.offload.loading import Loads
from hybridkv.offload.pending_stores import PendingStores
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.store_on_compute import ComputedStores
from hybridkv.offload.store_writes import StoreWrites
from hybridkv.offload.stream_order import StreamOrder
from hybridkv.offload.swap import Swap
from hybridkv.offload.tier_events import TierEvents
from hybridkv.offload.write_barrier import WriteBarrier
from hybridkv.offload.write_through import HostStores, WriteThrough
from hybridkv.tiers import DiskTier, HostTier, MooncakeTier, UnitKey


class TieredCache:
    """The tiers of one engine's device pool (module docstring)."""

    def __init__(
        self,
        manager: KVCacheManager,
        block_bytes: BlockBytes,
        host: HostTier | None,
        disk: DiskTier | None = None,
        order: StreamOrder | None = None,
        store: MooncakeTier | None = None,
    ) -> None:
        """``order``: how a step waits for copies (default: the host waits);
        ``store``: the shared store, under the host and disk tiers or alone."""
        if host is None and (disk is not None or store is None):
            raise ValueError("a TieredCache needs a host tier, or a store alone")
        if not manager.enable_caching:
            raise ValueError("tiers (kv_offloading_size, kv_store) need enable_prefix_caching=True")
        if not manager.hasher.is_cryptographic:
            raise ValueError(
                "tiers (kv_offloading_size, kv_store) need a collision-resistant hash_algo "
                "('sha256'): a tier hit is not checked token by token"
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
        self.order = order if order is not None else StreamOrder()
        self.cost = LoadCost(cuda=self.order.current_stream is not None)
        self.pending = PendingStores(self.order)
        #: The device step in flight (async scheduling), waited for before a copy.
        self.inflight = InFlightStep(stream_ordered=self.order.current_stream is not None)
        self.loads = Loads(
            manager,
            block_bytes,
            host,
            disk,
            self.events,
            self.stats,
            order=self.order,
            worth_loading=self._worth,
            store=store,
        )
        # The host tier's side (none with the store alone): demotion, write-through, swaps.
        self.demotion: Demotion | None = None
        self.write_through: WriteThrough | None = None
        self.swap: Swap | None = None
        if host is not None:
            self.demotion = Demotion(
                self.pool, self.policy, block_bytes, host, disk, self.events, self.stats
            )
            overflow = self._overflow if disk is not None else None
            stores = HostStores(host, block_bytes, self.pending, self.events, overflow)
            if self.policy.writes_through:
                self.write_through = WriteThrough(manager, stores, self.stats)
            self.swap = Swap(manager, stores, disk, self.loads.present, self.cost, self.stats)
            if disk is not None:
                host.spill = self.demotion.spill
        self.store_writes: StoreWrites | None = None
        self.computed_stores: ComputedStores | None = None
        if store is not None:
            self.store_writes = StoreWrites(
                self.policy, block_bytes, store, self.events, self.stats
            )
            self.pool.on_free = self._on_free
            self.computed_stores = ComputedStores(manager, self.store_writes)
        self.pool.on_take = self._on_take
        self._steps = 0  # ``poll`` calls: one per scheduled step
        self._staged_in: dict[str, int] = {}  # request -> the step its loads were staged in
        manager.coordinator.other_holders.append(self.loads.held)
        if self.events is not None:
            events = self.events
            if host is not None:
                host.on_removed = lambda key: events.removed(key, "CPU")
            if disk is not None:
                disk.on_removed = lambda key: events.removed(key, "DISK")
        self._open = True

    def _overflow(self, key: UnitKey, parts: list[Any], value: float | None) -> None:
        """A unit the host tier had no room for goes to the disk tier (as a copy:
        its block may be reused before the disk write)."""
        assert self.demotion is not None
        self.demotion.spill(key, [p.cpu().numpy().copy() for p in parts], value)

    def _on_take(self, blocks: list[KVCacheBlock]) -> None:
        """``BlockPool.on_take``: the step in flight and the stores still reading
        ``blocks`` first (a demotion reads them, a load writes them), then demotion."""
        self.inflight.before_copy()
        self.pending.before_reuse(blocks)
        if self.demotion is not None:
            self.demotion.demote(blocks)

    def _on_free(self, blocks: list[KVCacheBlock]) -> None:
        """``BlockPool.on_free``: the store copies the freed blocks after the step in flight."""
        assert self.store_writes is not None
        self.inflight.before_copy()
        self.store_writes.on_free(blocks)

    def step_launched(self, fence: Fence) -> None:
        """Async scheduling: a step was launched (``InFlightStep.launched``)."""
        self.inflight.launched(fence)

    def step_landed(self, fence: Fence | None = None) -> None:
        """Async scheduling: the step of ``fence`` landed (None: all of them)."""
        self.inflight.landed(fence)

    def _worth(self, request: Request, wanted: list[tuple[int, int, bytes]], tokens: int) -> bool:
        """``Loads.worth_loading``: a swapped request's reload was decided at the
        swap; any other hit loads if ``LoadCost`` finds it cheaper than recomputing."""
        if self.swap is not None and self.swap.reloading(request):
            return True
        unit = self.block_bytes.unit_bytes
        return self.cost.load_cheaper(sum(unit[gid] for gid, _, _ in wanted), tokens)

    def prepare(self, request: Request, wait: bool) -> bool:
        """``Loads.prepare``: False while ``request``'s tier loads are in flight
        and ``wait`` is False; True once its prefix lookup may go ahead. The time
        it blocks (``wait``) is ``stats.load_wait_seconds``; a hit staged and
        landed in one call measures the load bandwidth (``LoadCost``)."""
        rid = request.request_id
        if self.store_writes is not None:
            self.store_writes.settle()
        staged = self.loads.is_staged(rid)
        hits, nbytes, waits = self.stats.hits, self.stats.bytes_loaded, self.order.stream_waits
        start = time.perf_counter()
        ready = self.loads.prepare(request, wait)
        if wait:
            self.stats.load_wait_seconds += time.perf_counter() - start
        if not ready:
            self._staged_in.setdefault(rid, self._steps)
            return False
        if self.swap is not None:
            self.swap.forget(rid)
        # Staged and landed within one step, not ordered on a stream: a copy's time.
        fresh = self._staged_in.pop(rid, self._steps) == self._steps or not staged
        if self.stats.hits > hits and fresh and self.order.stream_waits == waits:
            self.cost.observe_load(self.stats.bytes_loaded - nbytes, self.stats.load_seconds[-1])
        return True

    def start_loads(self) -> None:
        """``Loads.wake``: at the end of a schedule, the loads it left in flight start."""
        self.loads.wake()

    def loading(self, request: Request) -> bool:
        """True while ``request``'s tier loads are staged and not landed."""
        return self.loads.is_staged(request.request_id)

    def release(self, request: Request) -> None:
        """``Loads.release``: land an aborted request's loads, let go of its blocks."""
        self.loads.release(request)
        if self.swap is not None:
            self.swap.forget(request.request_id)
        self._staged_in.pop(request.request_id, None)

    def swap_out(self, request: Request, mode: str | None) -> bool:
        """``Swap.swap_out``: ``request`` was preempted (its blocks freed, its
        computed count not yet reset); ``mode``: ``SchedulerConfig.preemption_mode``."""
        if self.swap is None or self.demotion is None:
            return False  # no host tier (the store alone): preemption recomputes
        self.inflight.before_copy()  # the step in flight may be writing its blocks
        swapped = self.swap.swap_out(request, mode)
        self.demotion.flush_spills()  # what the host evicted for them goes to disk
        return swapped

    def after_step(
        self,
        computed: Sequence[tuple[Request, int, int]],
        tokens: int,
        prefill_tokens: int,
        seconds: float,
    ) -> None:
        """A step of ``tokens`` (``prefill_tokens`` of them prefill) ran in
        ``seconds`` (fed to ``LoadCost``): each ``(request, first, end)`` has
        tokens ``[first, end)`` computed (``first`` 0 at its first step: its hit
        too), which a write-through policy stores in the host tier, and the
        store gets what the policy wants shared at once (``ComputedStores``)."""
        self.cost.observe_step(tokens, prefill_tokens, seconds)
        if computed:  # (async scheduling: the step may still be in flight)
            self.inflight.before_copy()
        if self.computed_stores is not None:
            for request, first, end in computed:
                self.computed_stores.computed(request, first, end)
        if self.write_through is not None and self.demotion is not None:
            self.write_through.computed(computed)
            self.demotion.flush_spills()  # what the host evicted for them goes to disk

    def store_barrier(self) -> WriteBarrier:
        """The store writes in flight now (none without a store): the outputs of
        requests that finished in the last step go once it is done (``write_barrier.py``)."""
        if self.store_writes is None:
            return WriteBarrier((), self.stats, 0.0)
        return self.store_writes.barrier()

    def poll(self) -> None:
        """Settle the copies that have landed (each step, before scheduling)."""
        self._steps += 1
        if self.store_writes is not None:  # the last step's frees, as one batch
            self.store_writes.flush()
        self.pending.poll()
        if self.host is not None:
            self.host.poll()
        if self.events is not None:
            self.events.flush()

    def persist(self) -> None:
        """Write the device's cached blocks and the host's entries to the disk tier."""
        if self.demotion is not None:
            self.inflight.before_copy()
            self.demotion.persist()

    def close(self) -> None:
        """Persist (with a disk tier), wait for the store's writes, then close the
        tiers. Idempotent."""
        if not self._open:
            return
        self._open = False
        try:
            self.inflight.before_copy()
            self.pending.wait_all()
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
        self.pending.check_integrity(self.pool.blocks)
