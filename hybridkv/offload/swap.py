"""``Swap``: a preempted request's blocks go to the host tier and come back.

When the scheduler preempts a running request (its blocks freed, its
computed count reset), ``swap_out`` may first store the units its resume
needs in the host tier; on resume the request is an ordinary waiting one,
and ``Loads`` restores its hit through the normal load path (every unit
whole, a failed load recomputed), before its prefix lookup.

**What is swapped.** The *swap point* ``P`` is the longest hit of at most its
computed tokens (and one short of all its tokens) whose needed units are each
cached on the device or in a tier, by the coordinator's rule
(``tiered_hit_length``). Its units are: per group, the blocks from
``first_needed_block(P)`` to ``P``: every block for full attention, the
window's blocks for sliding, the chunk's for chunked, and for a Mamba group
the single state at ``P``. Those the tiers hold already are not copied
again. Two things are *not* saved, and are recomputed on resume:

- the partial last block (no hash: not a unit): tokens past the last full
  block;
- a Mamba group's running state: it exists only at the request's computed
  end, and a unit is a state at a block boundary kept as a snapshot
  (``managers/snapshots.py``). If the computed end is not such a point, ``P``
  is the last boundary whose state is kept (every boundary under ``lru``;
  under ``hybrid`` the tail's and the kept points), and the resume recomputes
  from there.

    computed: |####|####|####|##..|      full attention: blocks 0-2 stored
    Mamba     |    |    | s3 | run|      state s3 kept: P = 3 blocks; the
                                         running state and block 3 recomputed

The decision's parts are ``swap_decision.py``'s (torch-free: the simulator
calls them too, ``hybridkv/sim/tier_swap.py``).

**When.** With ``preemption_mode`` ``"swap"`` always; with None when
``LoadCost`` finds ``2 * load(bytes of P's units)`` (out now, back on
resume) below ``recompute(P)``; with ``"recompute"`` never (vLLM's names and
values). A swapped request's reload skips the load-or-recompute check: it
was decided here. The stores are asynchronous, registered in
``PendingStores``, so the freed blocks' reuse waits for them. Each unit is
stored with the value ``P / units`` (prefill tokens the resume saves per
unit), which the ``hybrid`` ranking reads; a tier may still evict it, and
then the resume recomputes what is missing.
"""

from __future__ import annotations

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.coordinators.tiered_hit import Present
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.offload.load_cost import LoadCost
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.swap_decision import (
    PREEMPTION_MODES,
    may_swap,
    swap_point,
    swap_units,
    worth_swapping,
)
from hybridkv.offload.write_through import HostStores
from hybridkv.tiers import DiskTier, UnitKey

__all__ = ["PREEMPTION_MODES", "Swap"]


class Swap:
    """Swap preemption over one engine's tiers (module docstring)."""

    def __init__(
        self,
        manager: KVCacheManager,
        stores: HostStores,
        disk: DiskTier | None,
        present: Present,
        cost: LoadCost,
        stats: OffloadStats,
    ) -> None:
        """``present``: a unit is on the device or in a tier (``Loads.present``)."""
        self.manager = manager
        self.managers = manager.coordinator.managers
        self.cached = manager.block_pool.cached
        self.stores = stores
        self.unit_bytes = stores.block_bytes.unit_bytes
        self.host = stores.host
        self.disk = disk
        self.present = present
        self.cost = cost
        self.stats = stats
        #: Requests swapped out and not yet reloaded (their reload is not re-decided).
        self.swapped: set[str] = set()

    def swap_point(self, request: Request) -> int:
        """Tokens of ``request`` a swap can restore (module docstring)."""
        request.bind_hasher(self.manager.hasher)
        return swap_point(self.managers, request, self.present)

    def units(self, request: Request, point: int) -> list[tuple[int, int, bytes]]:
        """``(group, block index, hash)`` of every unit a hit at ``point`` needs."""
        return swap_units(self.managers, request.live_block_hashes, point)

    def swap_out(self, request: Request, mode: str | None = None) -> bool:
        """``request`` is being preempted (its blocks not freed yet): store the
        units of its swap point in the host tier if ``mode`` (``"swap"``,
        ``"recompute"``, None) or the cost model says so. True if it was swapped."""
        if not may_swap(mode):
            return False
        point = self.swap_point(request)
        if point == 0:
            return False
        units = self.units(request, point)
        nbytes = sum(self.unit_bytes[gid] for gid, _, _ in units)
        if not worth_swapping(mode, self.cost, nbytes, point):
            self.stats.swaps_declined += 1
            return False
        blocks: list[tuple[int, KVCacheBlock]] = []
        for gid, _, h in units:
            key = UnitKey(h, gid)
            if self._in_a_tier(key):
                continue
            b = self.cached[gid].get(h)
            assert b is not None, "a swap unit is on the device or in a tier"
            blocks.append((gid, b))
        value = point / max(1, len(units))
        started = self.stores.store(blocks, value)
        self.swapped.add(request.request_id)
        self.stats.swaps += 1
        self.stats.swapped_units += started
        self.stats.swapped_tokens += point
        return True

    def _in_a_tier(self, key: UnitKey) -> bool:
        return self.host.contains(key) or (self.disk is not None and self.disk.contains(key))

    def reloading(self, request: Request) -> bool:
        """``request``'s tier hit is being staged: True if it was swapped out (its
        reload is not re-decided); it is no longer counted as swapped."""
        if request.request_id in self.swapped:
            self.swapped.discard(request.request_id)
            return True
        return False

    def forget(self, request_id: str) -> None:
        """The request's lookup went ahead (or it ended): nothing left to reload."""
        self.swapped.discard(request_id)
