"""``WriteThrough``: each block stored in the host tier as soon as it is computed.

The ``lru`` baseline with tiers (``CachePolicy.writes_through``), as vLLM's
``OffloadingConnector`` does it: after each step, every full block a
scheduled request's step computed (and, at its first step, the blocks of its
prefix hit) is stored in the host tier as ``UnitKey(block hash, group)``
unless the tier holds it already (then it is touched, as a use). Nothing is
demoted when the pool later reuses the block (``LruPolicy.demotion_value`` is
None): the host already has it, or its LRU dropped it.

The copies are asynchronous: they run on the copy thread (CPU) or the copy
stream (CUDA, after the step's kernels) while the next steps run, and each
is registered in ``PendingStores``, which orders the block's reuse after it
(``BlockPool.on_take``). A full, computed block is never written again
before that (attention appends to later blocks; a Mamba group writes its
next states to later entries), so nothing else can overwrite it. Null
entries (a window's skipped blocks, Mamba entries without a state) and the
partial last block (no hash) are not stored.

    step k computes tokens [s, e) of a request:
    group g's blocks  | ... | s//bs | ... | e//bs - 1 | e//bs (partial) |
                              \\____ stored after step k ____/   not stored
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.pending_stores import PendingStores
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.tier_events import TierEvents
from hybridkv.tiers import HostTier, TierFullError, UnitKey

#: Where a unit the host tier has no room for goes: ``(key, parts, value)``.
Overflow = Callable[[UnitKey, list[Any], "float | None"], None]


@dataclass(frozen=True, slots=True)
class HostStores:
    """Asynchronous stores of device blocks into the host tier: each registered in
    ``pending`` (the block's reuse waits for it) and announced by ``events`` once
    landed; a unit the host has no room for (a batch never evicts its own entries
    in flight) goes to ``overflow`` (the disk tier), else nowhere."""

    host: HostTier
    block_bytes: BlockBytes
    pending: PendingStores
    events: TierEvents | None
    overflow: Overflow | None = None

    def store(self, blocks: list[tuple[int, KVCacheBlock]], value: float | None) -> int:
        """Store the ``(group, block)`` units (one batch); a key the host holds is only
        touched (an LRU use), one it is storing left alone. Returns the number of new
        stores started."""
        keys = []
        for gid, b in blocks:
            assert b.block_hash is not None
            keys.append(UnitKey(b.block_hash, gid))
        todo = [
            (k, b)
            for k, b, held in zip(keys, blocks, self.host.touch(keys), strict=True)
            if not held
        ]
        if not todo:
            return 0
        items = [(k, self.block_bytes.parts(gid, b.block_id), value) for k, (gid, b) in todo]
        started = 0
        for (_, (_, b)), item, t in zip(todo, items, self.host.store_many(items), strict=True):
            if t.done() and isinstance(t.error, TierFullError):
                if self.overflow is not None:
                    self.overflow(*item)
                continue
            self.pending.add(b, t)
            started += 1
            if self.events is not None:
                self.events.storing(item[0], t, "CPU")
        return started


class WriteThrough:
    """Stores computed blocks in the host tier after each step (module docstring)."""

    def __init__(self, manager: KVCacheManager, stores: HostStores, stats: OffloadStats) -> None:
        self.coordinator = manager.coordinator
        self.block_sizes = [m.block_size for m in manager.coordinator.managers]
        self.stores = stores
        self.stats = stats

    def computed(self, request: Request, first: int, end: int) -> None:
        """``request``'s tokens ``[first, end)`` are computed (or were its hit, for
        ``first`` 0): store the full blocks among them."""
        tables = self.coordinator.get_blocks(request.request_id)
        blocks: list[tuple[int, KVCacheBlock]] = []
        for gid, table in enumerate(tables):
            bs = self.block_sizes[gid]
            for b in table[first // bs : end // bs]:
                if b.block_hash is not None and not b.is_null:
                    blocks.append((gid, b))
        if blocks:
            self.stats.written_through += self.stores.store(blocks, None)
