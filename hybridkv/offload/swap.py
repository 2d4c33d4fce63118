"""``Swap``: a preempted request's blocks go to the host tier and come back.

When the scheduler preempts a running request, it frees its blocks and then
calls ``swap_out`` (before resetting its computed count): the units its resume
needs may be stored in the host tier; on resume the request is an ordinary
waiting one, and ``Loads`` restores its hit through the normal load path
(every unit whole, a failed load recomputed), before its prefix lookup.

**What is swapped.** The *swap point* ``P`` is the longest hit of at most its
computed tokens (and one short of all its tokens) whose needed units are each
cached on the device or in a tier, by the coordinator's rule
(``tiered_hit_length``). Its units are: per group, the blocks from
``first_needed_block(P)`` to ``P``: every block for full attention, the
window's blocks for sliding, the chunk's for chunked, and for a Mamba group
the single state at ``P``. Two things are *not* saved, and are recomputed on
resume:

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

**Which units, and when** (``swap_decision.plan_swap``, torch-free: the
simulator calls it too, ``hybridkv/sim/tier_swap.py``). With
``preemption_mode`` None, only the units the pool's reuse would lose: on the
device, free, no tier holding them, and not demoted by the policy
(``CachePolicy.demotion_value`` None); the rest are demoted if the pool reuses
them before the resume, so a copy now would save nothing. They are copied
only when ``LoadCost`` finds two copies of their bytes (out now, back on
resume) cheaper than recomputing the tokens they keep, and stored as
``SPARE``: into the host's spare room only, never in place of a valued unit
(``tiers/spare.py``), and never spilled to disk. With ``"swap"`` every unit
no tier holds is stored, valued ``P / units`` (prefill tokens the resume
saves per unit, which the ``hybrid`` ranking reads); with ``"recompute"``
nothing (vLLM's names and values). A swapped request's reload skips the
load-or-recompute check: it was decided here. The stores are asynchronous,
registered in ``PendingStores``, so the freed blocks' reuse waits for them; a
tier may still evict a stored unit, and then the resume recomputes what is
missing.
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
    Decision,
    Fate,
    SwapPlan,
    device_fate,
    plan_swap,
    swap_point,
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
        self.policy = manager.coordinator.policy
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

    def fate(self, gid: int, i: int, h: bytes) -> Fate:
        """``swap_decision.Fate`` of a present unit: in the host or disk tier, else
        on the device (``device_fate``), else in the shared store (a tier too)."""
        if self.host.contains(UnitKey(h, gid)) or (
            self.disk is not None and self.disk.contains(UnitKey(h, gid))
        ):
            return Fate.IN_TIER
        block = self.cached[gid].get(h)
        return Fate.IN_TIER if block is None else device_fate(block, self.policy)

    def plan(self, request: Request, mode: str | None) -> SwapPlan | None:
        """``plan_swap`` for the freed ``request`` over this engine's state. Read-only."""
        assert not self.manager.coordinator.has_request(request.request_id), (
            "swap_out is decided once the preempted request's blocks are freed"
        )
        request.bind_hasher(self.manager.hasher)
        return plan_swap(
            self.managers, request, mode, self.present, self.fate, self.unit_bytes, self.cost
        )

    def swap_out(self, request: Request, mode: str | None = None) -> bool:
        """``request`` was preempted (its blocks freed, its computed count not yet
        reset): store the units ``plan`` picks in the host tier, under ``mode``
        (``"swap"``, ``"recompute"``, None). True if it was swapped."""
        plan = self.plan(request, mode)
        if plan is None:
            return False
        if plan.decision is not Decision.SWAP:
            if plan.decision is Decision.DECLINED:
                self.stats.swaps_declined += 1
            else:
                self.stats.swaps_unneeded += 1
            return False
        blocks: list[tuple[int, KVCacheBlock]] = []
        for gid, _, h in plan.copies:
            b = self.cached[gid].get(h)
            assert b is not None, "a unit no tier holds is on the device"
            blocks.append((gid, b))
        started = self.stores.store(blocks, plan.value) if blocks else 0
        self.swapped.add(request.request_id)
        self.stats.swaps += 1
        self.stats.swapped_units += started
        self.stats.swapped_tokens += plan.point
        return True

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
