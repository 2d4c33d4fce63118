"""``Loads``: a waiting request's tier hit restored onto the device.

``prepare`` is called by the scheduler before a waiting request's prefix
lookup. The request's longest hit across the device and the tiers is found
by the coordinator's rule (``tiered_hit_length``: every group's needed
blocks present on the device or in a tier, so no partial unit is ever a
hit). If it passes the device's, the blocks the hit needs are taken from the
pool and held (count first: if they do not fit, the tiers are not used): the
device blocks it reads, and a new block for each unit to load, whose copy
from the host (or disk) tier starts at once. While loads are in flight the
held blocks (ref count + 1, out of the free set) are never evicted or
reused, and the request is not run: the scheduler waits on the copies (the
copy thread on the CPU, the copy stream's event on CUDA) when nothing else
runs, else defers it. Once every copy has landed each loaded block enters
the device prefix index under its key and the held blocks are let go,
cached and free, right before the request's own ``get_computed_blocks``
finds the whole hit on the device and its ``allocate_slots`` adopts it
(nothing takes a block from the pool in between). A failed load's block
stays out of the index, so those tokens are recomputed, never read stale.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.coordinators.tiered_hit import tiered_hit_length
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.staged_loads import (
    Load,
    Run,
    Staged,
    block_ids,
    load_of,
    pick,
    runs,
    unit_keys,
)
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.store_lookup import StoreLookup
from hybridkv.offload.stream_order import StreamOrder
from hybridkv.offload.tier_events import TierEvents
from hybridkv.offload.tier_lookup import presence, tiers_may_hold
from hybridkv.offload.tier_pins import TierPins
from hybridkv.offload.unit_batches import load_units
from hybridkv.tiers import DiskTier, HostTier, MooncakeTier, TierStore, UnitKey

#: ``(request, units to load as (group, block index, hash), tokens gained) -> bool``.
WorthLoading = Callable[[Request, list[tuple[int, int, bytes]], int], bool]


class Loads:
    """The load side of a ``TieredCache`` (module docstring)."""

    def __init__(
        self,
        manager: KVCacheManager,
        block_bytes: BlockBytes,
        host: HostTier | None,
        disk: DiskTier | None,
        events: TierEvents | None,
        stats: OffloadStats,
        order: StreamOrder | None = None,
        worth_loading: WorthLoading | None = None,
        store: MooncakeTier | None = None,
    ) -> None:
        self.order = order if order is not None else StreamOrder()
        self.worth_loading = worth_loading
        self.manager = manager
        self.pool = manager.block_pool
        self.managers = manager.coordinator.managers
        self.block_bytes = block_bytes
        self.host = host
        self.disk = disk
        self.store = store
        #: The tiers in this process, highest first (asked one key at a time).
        self.local: list[HostTier | DiskTier] = [t for t in (host, disk) if t is not None]
        self.lookup = None if store is None else StoreLookup(store, self.managers, self.present)
        self.events = events
        self.stats = stats
        self._staged: dict[str, Staged] = {}

    def present(self, group_id: int, _index: int, block_hash: bytes) -> bool:
        if block_hash in self.pool.cached[group_id]:
            return True
        key = UnitKey(block_hash, group_id)
        return any(t.contains(key) for t in self.local) or (
            self.lookup is not None and key in self.lookup.found
        )

    def on_device(self, group_id: int, _index: int, block_hash: bytes) -> bool:
        return block_hash in self.pool.cached[group_id]

    def prepare(self, request: Request, wait: bool) -> bool:
        """Before ``request``'s prefix lookup: restore its tier hit onto the device.
        False while its loads are in flight and ``wait`` is False (then do not run
        it this step); True once the lookup may go ahead: the loaded blocks are
        then cached and free on the device, and nothing may take a block from the
        pool before the request's ``get_computed_blocks`` + ``allocate_slots``
        (which adopt them at once, as any device hit)."""
        rid = request.request_id
        if self.events is not None:
            self.events.flush()
        staged = self._staged.get(rid)
        if staged is None:
            staged = self._stage(request)
            if staged is None:
                return True
            self._staged[rid] = staged
        done = all(ld.transfer is None or self.order.ready(ld.transfer) for ld in staged.loads)
        if not (wait or done):
            return False
        self.release(request)
        return True

    def release(self, request: Request) -> None:
        """Land the request's loads (waiting for those in flight) and let go of the
        blocks held for them (an aborted request; ``prepare`` does it itself)."""
        staged = self._staged.pop(request.request_id, None)
        if staged is not None:
            self._land(request, staged)
            self.pool.free_blocks(staged.held)
            # its whole load: from the decision to the blocks indexed and let go (usable)
            self.stats.load_seconds.append(time.perf_counter() - staged.started)

    def _stage(self, request: Request) -> Staged | None:
        """Hold the blocks of the request's tier hit and start its loads (None: no tier hit)."""
        if self.lookup is None and not any(t.used_bytes for t in self.local):
            return None  # the tiers hold nothing (nor anything in flight): no lookup
        request.bind_hasher(self.manager.hasher)
        hashes = request.live_block_hashes
        limit = request.num_tokens - 1
        if self.lookup is None and not tiers_may_hold(self.managers, self.local, hashes, limit):
            return None  # no tier holds a block of it: its hit is the device's own
        if self.lookup is not None:
            self.lookup.ask(hashes, limit)  # one request for what the store holds
        try:
            return self._stage_hit(request, hashes, limit)
        finally:
            if self.lookup is not None:
                self.lookup.forget()

    def _stage_hit(self, request: Request, hashes: list[bytes], limit: int) -> Staged | None:
        found = self.lookup.found if self.lookup is not None else set()
        present, on_device = presence(self.pool.cached, self.managers, self.local, found, hashes)
        total = tiered_hit_length(self.managers, hashes, limit, present)
        if total == 0:
            return None
        device = tiered_hit_length(self.managers, hashes, total, on_device)
        if device == total:
            return None
        cached = self.pool.cached
        keep: list[KVCacheBlock] = []
        wanted: list[tuple[int, int, bytes]] = []
        spans: list[tuple[int, int, int]] = []  # (group, start, end) of its units in wanted
        for m in self.managers:
            gid, view, start = m.group_id, m.group_hashes(hashes), len(wanted)
            for i in range(m.first_needed_block(total), total // m.block_size):
                b = cached[gid].get(view[i])
                if b is not None:
                    keep.append(b)
                else:
                    wanted.append((gid, i, view[i]))
            if len(wanted) > start:
                spans.append((gid, start, len(wanted)))
        need = len(wanted) + sum(1 for b in keep if b.ref_cnt == 0)
        if need > self.pool.num_free_blocks:
            self.stats.skipped_no_room += 1
            return None
        if self.worth_loading is not None and not self.worth_loading(
            request, wanted, total - device
        ):
            self.stats.skipped_slower += 1
            return None
        started = time.perf_counter()  # decided: from here to the blocks indexed is the load
        keys = unit_keys(wanted)
        pins = TierPins(self._tiers(), keys, self.store, found)
        try:
            self.pool.touch(keep)
            blocks = self.pool.get_new_blocks(len(wanted))  # may demote: the pins hold ours
            loads = self._start_loads(wanted, spans, keys, pins, blocks)
        finally:
            pins.release()  # what no load took over
        return Staged(keep + blocks, loads, total - device, started)

    def _tiers(self) -> list[TierStore]:
        return [*self.local] if self.store is None else [*self.local, self.store]

    def _start_loads(
        self,
        wanted: list[tuple[int, int, bytes]],
        spans: list[tuple[int, int, int]],
        keys: list[UnitKey],
        pins: TierPins,
        blocks: list[KVCacheBlock],
    ) -> list[Load]:
        """Start the loads of ``wanted`` (pinned in tier ``pins.where[j]``) into
        ``blocks``: the host tier's straight into the device buffers, each group's
        as one batch (``load_units``: rows on the CPU, parts elsewhere, one
        transfer per group, taking the host's pins over); the others' read into
        them on the CPU (through host memory elsewhere), one batch per tier."""
        tiers, where = self._tiers(), pins.where
        host = 0 if self.host is not None else None  # the host tier is the first
        loads: list[Load] = []
        host_groups: list[tuple[int, Sequence[int]]] = []  # (group, units in wanted)
        other: list[list[int]] = [[] for _ in tiers]
        for gid, start, end in spans:
            here = where[start:end]
            buckets: dict[int, Sequence[int]]
            if here.count(here[0]) == len(here):  # the common case: one tier holds them all
                buckets = {here[0]: range(start, end)}
            else:
                buckets = {}
                for j, k in enumerate(here, start):
                    buckets.setdefault(k, []).append(j)  # type: ignore[attr-defined]
            for k, units in buckets.items():
                if k == host:
                    host_groups.append((gid, units))
                elif k >= 0:
                    other[k].extend(units)
                else:  # none holds them (they left their tier): failed loads
                    loads += [load_of(wanted, blocks, [j], None, "CPU") for j in units]
        if host_groups:
            assert self.host is not None
            started = load_units(
                self.host,
                self.block_bytes,
                [(g, pick(keys, js), block_ids(pick(blocks, js))) for g, js in host_groups],
                wake=False,  # the scheduler waits at once, or calls wake() before its step
                pins=pins.batches[0],
            )
            for (_, js), group_spans in zip(host_groups, started, strict=True):
                for t, a, b in group_spans:
                    loads.append(load_of(wanted, blocks, js[a:b], t, "CPU"))
        for k, units in enumerate(other):
            if not units:
                continue
            items = []
            for j in units:  # read on the CPU, or bytes
                parts = self.block_bytes.parts(wanted[j][0], blocks[j].block_id)
                items.append(
                    (keys[j], [p.numpy() for p in parts] if parts[0].device.type == "cpu" else None)
                )
            for j, t in zip(units, tiers[k].load_many(items), strict=True):
                loads.append(load_of(wanted, blocks, [j], t, tiers[k].medium))
        return loads

    def _land(self, request: Request, staged: Staged) -> None:
        """Wait for the loads; enter each landed block into the device prefix index."""
        tokens = request.live_token_ids
        failed = 0
        pool, unit_bytes = self.pool, self.block_bytes.unit_bytes
        landed: list[Run] = []
        for ld in staged.loads:
            t = ld.transfer
            if t is None or not self.order.after(t):
                failed += len(ld.blocks)
                continue
            if ld.medium != "CPU" and t.result is not None:
                self._copy_in(ld)
            n = len(ld.blocks)
            self.stats.count_load(ld.medium, unit_bytes[ld.group_id] * n, n)
            landed.extend(runs(ld))
        landed.sort(key=lambda r: (r[0], r[1]))  # each group in order (events: parents first)
        keeps_tokens = pool.record_token_ids or pool.enable_kv_cache_events
        for gid, first, hashes, blocks in landed:
            n = len(blocks)
            bs = self.managers[gid].block_size
            run_tokens = tokens[first * bs : (first + n) * bs] if keeps_tokens else []
            new = pool.cache_run(blocks, hashes, gid, run_tokens, bs, 0, n)
            if new and pool.enable_kv_cache_events:
                parent = self.managers[gid].group_hashes(request.live_block_hashes)
                for k in new:
                    i = first + k
                    pool.record_stored(
                        [hashes[k]],
                        parent[i - 1] if i else None,
                        tokens[i * bs : (i + 1) * bs],
                        bs,
                        request.lora_name,
                        gid,
                    )
        if failed:
            self.stats.load_failures += failed
        else:
            self.stats.hit_tokens += staged.gained
            self.stats.hits += 1
            media = {ld.medium for ld in staged.loads}  # counted by the lowest tier
            if "STORE" in media:
                self.stats.store_hits += 1
                self.stats.store_hit_tokens += staged.gained
            elif "DISK" in media:
                self.stats.disk_hits += 1
                self.stats.disk_hit_tokens += staged.gained

    def _copy_in(self, ld: Load) -> None:
        """A disk or store load read into host memory (a non-CPU device): copy it in."""
        assert ld.transfer is not None and len(ld.blocks) == 1
        parts = self.block_bytes.parts(ld.group_id, ld.blocks[0].block_id)
        for dst, src in zip(parts, ld.transfer.result, strict=True):
            if isinstance(src, memoryview | bytes):
                dst.copy_(torch.tensor(bytearray(src), dtype=torch.uint8))

    def wake(self) -> None:
        """Start the host copies staged without waking its copy thread (a staged
        request's loads run when the scheduler waits for them, else from here)."""
        if self.host is not None and self._staged:
            self.host.wake()

    def is_staged(self, request_id: str) -> bool:
        """True while the request's hit is staged (its loads not landed yet)."""
        return request_id in self._staged

    def held(self) -> Iterator[KVCacheBlock]:
        """Every block held for a hit being restored."""
        for staged in self._staged.values():
            yield from staged.held

    def check_integrity(self) -> None:
        """Every held block is in use and not free; every load's block is held."""
        for rid, staged in self._staged.items():
            for b in staged.held:
                assert not b.is_null and b.ref_cnt >= 1, f"{rid}: held block {b} is free"
            held = {id(b) for b in staged.held}
            for ld in staged.loads:
                for b in ld.blocks:
                    assert id(b) in held, f"{rid}: a load's block is not held"
                    assert b.block_hash is None, f"{rid}: {b} cached before it landed"
