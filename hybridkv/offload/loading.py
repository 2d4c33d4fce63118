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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.coordinators.tiered_hit import tiered_hit_length
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.store_lookup import StoreLookup
from hybridkv.offload.stream_order import StreamOrder
from hybridkv.offload.tier_events import TierEvents
from hybridkv.offload.tier_lookup import tiers_may_hold
from hybridkv.offload.unit_batches import load_units
from hybridkv.tiers import DiskTier, HostTier, MooncakeTier, TierStore, Transfer, UnitKey

#: ``(request, units to load as (group, block index, hash), tokens gained) -> bool``.
WorthLoading = Callable[[Request, list[tuple[int, int, bytes]], int], bool]


class _Load(NamedTuple):
    """One unit being copied into ``block`` from the ``medium`` tier."""

    group_id: int
    position: int  # the block's index in the group's table
    block_hash: bytes
    block: KVCacheBlock
    transfer: Transfer | None  # None: the unit left its tier before the load began
    medium: str  # "CPU" (host), "DISK", "STORE"


@dataclass
class _Staged:
    """A request's hit being restored: the blocks held for it and the loads."""

    held: list[KVCacheBlock]
    loads: list[_Load]
    gained: int  # tokens past the device hit, if every load lands
    started: float  # when the first copy was asked for


def _runs(loads: list[_Load]) -> Iterator[list[_Load]]:
    """``loads`` split into runs of consecutive blocks of one group, in order."""
    run: list[_Load] = []
    for ld in loads:
        if run and (ld.group_id != run[-1].group_id or ld.position != run[-1].position + 1):
            yield run
            run = []
        run.append(ld)
    if run:
        yield run


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
        self._staged: dict[str, _Staged] = {}

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

    def _stage(self, request: Request) -> _Staged | None:
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

    def _stage_hit(self, request: Request, hashes: list[bytes], limit: int) -> _Staged | None:
        total = tiered_hit_length(self.managers, hashes, limit, self.present)
        if total == 0:
            return None
        device = tiered_hit_length(self.managers, hashes, total, self.on_device)
        if device == total:
            return None
        cached = self.pool.cached
        keep: list[KVCacheBlock] = []
        wanted: list[tuple[int, int, bytes]] = []
        for m in self.managers:
            gid, view = m.group_id, m.group_hashes(hashes)
            for i in range(m.first_needed_block(total), total // m.block_size):
                b = cached[gid].get(view[i])
                if b is not None:
                    keep.append(b)
                else:
                    wanted.append((gid, i, view[i]))
        need = len(wanted) + sum(1 for b in keep if b.ref_cnt == 0)
        if need > self.pool.num_free_blocks:
            self.stats.skipped_no_room += 1
            return None
        if self.worth_loading is not None and not self.worth_loading(
            request, wanted, total - device
        ):
            self.stats.skipped_slower += 1
            return None
        pins = self._pin([UnitKey(h, g) for g, _, h in wanted])
        try:
            self.pool.touch(keep)
            blocks = self.pool.get_new_blocks(len(wanted))  # may demote: the pins hold ours
            started = time.perf_counter()
            loads = self._start_loads(wanted, blocks)
        finally:
            for tier, key in pins:
                tier.unpin(key)
        return _Staged(keep + blocks, loads, total - device, started)

    def _tiers(self) -> list[TierStore]:
        return [*self.local] if self.store is None else [*self.local, self.store]

    def _holds(self, tier: TierStore, key: UnitKey) -> bool:
        if tier is self.store:
            return self.lookup is not None and key in self.lookup.found
        return tier.contains(key)

    def _pin(self, keys: list[UnitKey]) -> list[tuple[TierStore, UnitKey]]:
        pinned: list[tuple[TierStore, UnitKey]] = []
        tiers = self._tiers()
        for key in keys:
            for tier in tiers:
                if self._holds(tier, key):
                    tier.pin(key)
                    pinned.append((tier, key))
                    break
        return pinned

    def _start_loads(
        self, wanted: list[tuple[int, int, bytes]], blocks: list[KVCacheBlock]
    ) -> list[_Load]:
        """One batch per tier: host units straight into the device buffers
        (``load_units``: rows on the CPU), the others read into them on the CPU
        (through host memory elsewhere)."""
        tiers = self._tiers()
        items: list[list[tuple[UnitKey, Any]]] = [[] for _ in tiers]
        where: list[tuple[int, int]] = []
        for (gid, _, h), b in zip(wanted, blocks, strict=True):
            key = UnitKey(h, gid)
            k = next((j for j, tier in enumerate(tiers) if self._holds(tier, key)), -1)
            if k < 0:  # it left its tier meanwhile: a failed load
                where.append((-1, -1))
                continue
            where.append((k, len(items[k])))
            if tiers[k] is self.host:  # a block id: load_units picks rows or parts
                items[k].append((key, b.block_id))
                continue
            parts = self.block_bytes.parts(gid, b.block_id)  # read on the CPU, or bytes
            into = [p.numpy() for p in parts] if parts[0].device.type == "cpu" else None
            items[k].append((key, into))
        started = [
            (
                []
                if not its
                else load_units(tier, self.block_bytes, its)
                if tier is self.host
                else tier.load_many(its)
            )
            for tier, its in zip(tiers, items, strict=True)
        ]
        loads = []
        for (gid, i, h), b, (k, j) in zip(wanted, blocks, where, strict=True):
            t = None if k < 0 else started[k][j]
            loads.append(_Load(gid, i, h, b, t, "CPU" if k < 0 else tiers[k].medium))
        return loads

    def _land(self, request: Request, staged: _Staged) -> None:
        """Wait for the loads; enter each landed block into the device prefix index."""
        tokens = request.live_token_ids
        failed = 0
        pool = self.pool
        landed: list[_Load] = []
        for ld in staged.loads:
            ok = ld.transfer is not None and self.order.after(ld.transfer)
            if (
                ok
                and ld.medium != "CPU"
                and ld.transfer is not None
                and ld.transfer.result is not None
            ):
                self._copy_in(ld)
            if not ok:
                failed += 1
                continue
            landed.append(ld)
            self.stats.count_load(ld.medium, self.block_bytes.unit_bytes[ld.group_id])
        for run in _runs(landed):  # consecutive blocks of one group: one cache_run each
            gid, first, n = run[0].group_id, run[0].position, len(run)
            bs = self.managers[gid].block_size
            hashes = [ld.block_hash for ld in run]
            run_tokens = tokens[first * bs : (first + n) * bs]
            new = pool.cache_run([ld.block for ld in run], hashes, gid, run_tokens, bs, 0, n)
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
        self.stats.load_seconds.append(time.perf_counter() - staged.started)
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

    def _copy_in(self, ld: _Load) -> None:
        """A disk or store load read into host memory (a non-CPU device): copy it in."""
        assert ld.transfer is not None
        parts = self.block_bytes.parts(ld.group_id, ld.block.block_id)
        for dst, src in zip(parts, ld.transfer.result, strict=True):
            if isinstance(src, memoryview | bytes):
                dst.copy_(torch.tensor(bytearray(src), dtype=torch.uint8))

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
            for ld in staged.loads:
                assert ld.block in staged.held, f"{rid}: a load's block is not held"
                assert ld.block.block_hash is None, f"{rid}: {ld.block} cached before it landed"
