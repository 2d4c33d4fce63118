"""``WriteThrough``: each block stored in the host tier as soon as it is computed.

The ``lru`` baseline with tiers (``CachePolicy.writes_through``), as vLLM's
``OffloadingConnector`` does it: after each step, every full block a
scheduled request's step computed (and, at its first step, the blocks of its
prefix hit) is stored in the host tier as ``UnitKey(block hash, group)``
unless the tier holds it already (then it is touched, as a use); the step's
blocks go as one batch (``HostStores``: on the CPU one transfer per group and
one gather per layer). Nothing is
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.pending_stores import PendingStores
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.tier_events import TierEvents
from hybridkv.offload.unit_batches import start_stores
from hybridkv.tiers import HostTier, TierFullError, Transfer, UnitKey
from hybridkv.tiers.spare import is_spare

#: Where a unit the host tier has no room for goes: ``(key, parts, value)``.
Overflow = Callable[[UnitKey, list[Any], "float | None"], None]


@dataclass(frozen=True, slots=True)
class HostStores:
    """Asynchronous stores of device blocks into the host tier: each registered in
    ``pending`` (the block's reuse waits for it) and announced by ``events`` once
    landed; a unit the host has no room for (a batch never evicts its own entries
    in flight) goes to ``overflow`` (the disk tier), else nowhere; a unit stored
    as ``SPARE`` (spare room only, ``tiers/spare.py``) goes nowhere.

    A batch moves as one transfer per group (``start_stores``): on the CPU
    (``rows_ok``: a ``SlabMemory`` host) as rows, one gather per layer on the
    copy thread; elsewhere (CUDA: ``TorchHostMemory``) as each unit's parts, one
    copy-stream pass into pinned buffers and one event per group. The transfer
    is registered for each block it reads."""

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
        units = [(k, b.block_id) for k, (_, b) in zip(keys, blocks, strict=True)]
        started = start_stores(self.host, self.block_bytes, units, [value] * len(units))
        return self._register(keys, blocks, started, value)

    def _register(
        self,
        keys: list[UnitKey],
        blocks: list[tuple[int, KVCacheBlock]],
        outcomes: list[Transfer | BaseException | None],
        value: float | None,
    ) -> int:
        """Per unit: its store in flight (a transfer) registered with ``pending`` and
        ``events``, a valued unit skipped for room (``TierFullError``) sent to ``overflow``,
        or nothing (held already). Returns the stores started."""
        started = 0
        reading: dict[Transfer, list[KVCacheBlock]] = {}  # a row batch's one transfer
        for key, (gid, b), outcome in zip(keys, blocks, outcomes, strict=True):
            if isinstance(outcome, Transfer):
                reading.setdefault(outcome, []).append(b)
                started += 1
                if self.events is not None:
                    self.events.storing(key, outcome, "CPU")
            elif isinstance(outcome, TierFullError):
                if self.overflow is not None and not is_spare(value):
                    self.overflow(key, self.block_bytes.parts(gid, b.block_id), value)
            else:
                assert outcome is None, f"a store of {key!r} failed to start: {outcome!r}"
        for transfer, read in reading.items():
            self.pending.add_many(read, transfer)
        return started


class WriteThrough:
    """Stores computed blocks in the host tier after each step (module docstring)."""

    def __init__(self, manager: KVCacheManager, stores: HostStores, stats: OffloadStats) -> None:
        self.coordinator = manager.coordinator
        self.block_sizes = [m.block_size for m in manager.coordinator.managers]
        self.stores = stores
        self.stats = stats

    def computed(self, computed: Sequence[tuple[Request, int, int]]) -> None:
        """Each ``(request, first, end)``: ``request``'s tokens ``[first, end)`` are
        computed (or were its hit, for ``first`` 0). Store the full blocks among
        them, every request's as one batch (one transfer per group on the CPU)."""
        blocks: list[tuple[int, KVCacheBlock]] = []
        for request, first, end in computed:
            tables = self.coordinator.get_blocks(request.request_id)
            for gid, table in enumerate(tables):
                bs = self.block_sizes[gid]
                for b in table[first // bs : end // bs]:
                    if b.block_hash is not None and not b.is_null:
                        blocks.append((gid, b))
        if blocks:
            self.stats.written_through += self.stores.store(blocks, None)
