"""``SimSwap``: swap preemption in ``hybridkv simulate`` (``--preemption-mode``).

The engine's decision (``hybridkv/offload/swap_decision.py``: ``plan_swap``),
called, not copied. When the scheduler preempts a running request, after its
blocks are freed (so each carries its release value) and before its computed
count is reset (``SwapScheduler._swap_out``, the engine's hook):

1. ``may_swap(mode)``: ``"recompute"`` never swaps;
2. the swap point: the longest hit of at most its computed tokens (and one
   short of all its tokens) whose units are each on the device or in a tier,
   by the coordinator's rule; its units: the full-attention blocks, the
   window's, the chunk's, the Mamba state at the point;
3. each unit's fate if the pool reused its block before the resume
   (``fate``: in a tier; kept, since a running request holds the block or the
   policy demotes it on reuse; lost, since it is free and not demoted);
4. the default (no ``--preemption-mode``, as the engine with
   ``preemption_mode`` unset) copies only the lost units, as spare (the
   host's free bytes and older spare units' only: ``TierIndex``'s spare room),
   when ``LoadCost`` finds ``2 * load(their bytes)`` below recomputing the
   tokens they keep; ``swap`` copies every unit no tier holds, valued
   (``point / units`` prefill tokens saved per unit), whatever the link.

The ``LoadCost`` is the engine's class with the device profile's figures:
its load bandwidth is the profile's host->device link
(``DeviceProfile.host_to_device_bandwidth``), and its seconds per prefill
token come from one modeled step fed through ``LoadCost.observe_step`` as the
engine feeds its measured ones: a prefill of ``max_num_batched_tokens``
tokens from position 0 (``CostModel.step``). Like the engine's figure it is
linear in tokens (a long context's recompute costs more), which errs toward
recomputing.

A copy is stored in the host (``TieredCache.store_host``): a spare one into
spare room only (else skipped: ``host_spare_skips``); a valued one under
``hybrid`` with the value class of its value scaled to the unit's bytes as
demotion does, the host's victims going to disk, under ``lru`` class 0, plain
LRU. Stores cost no modeled time (a device-to-host copy off the critical
path, as demotion and write-through here). On resume the request is an
ordinary waiting one: its device hit, then what the tiers hold past it,
loaded (``TierReplay``: ``reloaded_tokens``); a unit evicted meanwhile is
recomputed from there.

Figures (``TierFigures``): ``swaps``, ``swaps_declined`` (the cost model chose
recompute), ``swaps_unneeded`` (nothing would be lost: no copy),
``swapped_units`` / ``swapped_bytes`` (new stores), ``swapped_tokens`` (swap
points summed) and ``swap_saved_s``: for each swap, ``recompute(saved tokens)
- 2 * load(weighed bytes)`` as ``LoadCost`` estimated it at the decision
(``estimated_saving``). It is the engine's estimate, not what the replay
saved: where the device still holds a swapped request's blocks at its resume,
nothing is reloaded and nothing was saved. The realized effect is the hit
rate, makespan and TTFT against a ``--preemption-mode recompute`` run.
"""

from __future__ import annotations

from typing import Any

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.request import Request
from hybridkv.engine.scheduler import Scheduler
from hybridkv.offload.load_cost import LoadCost, LoadCostPrior
from hybridkv.offload.swap_decision import (
    Decision,
    Fate,
    SwapPlan,
    device_fate,
    estimated_saving,
    may_swap,
    plan_swap,
)
from hybridkv.policy import tier_value_class
from hybridkv.policy.base import CachePolicy
from hybridkv.sim.cost_model import CostModel
from hybridkv.sim.options import SimOptions
from hybridkv.sim.tier_model import TieredCache
from hybridkv.sim.tier_replay import TierReplay
from hybridkv.tiers.spare import is_spare


def profile_load_cost(cost: CostModel, max_num_batched_tokens: int) -> LoadCost:
    """The engine's ``LoadCost`` with ``cost``'s device figures (module docstring)."""
    load = LoadCost(cuda=True, prior=LoadCostPrior(cuda=cost.device.host_to_device_bandwidth))
    n = max_num_batched_tokens
    load.observe_step(n, n, cost.step([(0, n)]).seconds)
    return load


class SimSwap:
    """Swap preemption over one replay's tiers (module docstring). ``policy``:
    the device's cache policy (its ``demotion_value`` decides what is lost)."""

    def __init__(
        self, cache: TieredCache, mode: str | None, load_cost: LoadCost, policy: CachePolicy
    ) -> None:
        may_swap(mode)  # a bad mode is a ValueError here, before any replay
        self.cache = cache
        self.mode = mode
        self.load_cost = load_cost
        self.policy = policy
        self.swaps = self.swaps_declined = self.swaps_unneeded = 0
        self.swapped_units = self.swapped_bytes = self.swapped_tokens = 0
        self.swap_saved_s = 0.0

    def figures(self) -> dict[str, Any]:
        """``TierFigures``' swap fields."""
        return {
            "swaps": self.swaps,
            "swaps_declined": self.swaps_declined,
            "swaps_unneeded": self.swaps_unneeded,
            "swapped_units": self.swapped_units,
            "swapped_bytes": self.swapped_bytes,
            "swapped_tokens": self.swapped_tokens,
            "swap_saved_s": self.swap_saved_s,
        }

    def _present(self, gid: int, i: int, h: bytes) -> bool:
        cache = self.cache
        return h in cache.device_cached[gid] or any((h, gid) in t for t in cache.tiers)

    def fate(self, gid: int, i: int, h: bytes) -> Fate:
        """``swap_decision.Fate`` of a present unit: in a tier, else on the device."""
        cache = self.cache
        if any((h, gid) in t for t in cache.tiers):
            return Fate.IN_TIER
        block = cache.device_cached[gid][h]
        assert isinstance(block, KVCacheBlock)
        return device_fate(block, self.policy)

    def plan(self, request: Request, hasher: Any) -> SwapPlan | None:
        """``plan_swap`` for the freed ``request`` over this replay's state. Read-only."""
        request.bind_hasher(hasher)
        cache = self.cache
        return plan_swap(
            cache.managers,
            request,
            self.mode,
            self._present,
            self.fate,
            cache.unit_bytes,
            self.load_cost,
        )

    def swap_out(self, request: Request, hasher: Any) -> bool:
        """``request`` was preempted (its blocks freed, its computed count not yet
        reset): store the units ``plan`` picks in the host. True if it was swapped."""
        plan = self.plan(request, hasher)
        if plan is None:
            return False
        if plan.decision is not Decision.SWAP:
            if plan.decision is Decision.DECLINED:
                self.swaps_declined += 1
            else:
                self.swaps_unneeded += 1
            return False
        cache = self.cache
        unit_bytes = cache.unit_bytes
        spare = is_spare(plan.value)
        for gid, _, h in plan.copies:
            if spare:
                cls = None
            else:
                cls = (
                    0
                    if cache.write_through
                    else tier_value_class(plan.value) + cache.class_shift[gid]
                )
            if cache.store_host((h, gid), gid, cls):
                self.swapped_units += 1
                self.swapped_bytes += unit_bytes[gid]
        self.swaps += 1
        self.swapped_tokens += plan.point
        saving = estimated_saving(plan, self.load_cost)
        if saving is not None:
            self.swap_saved_s += saving
        return True


class SwapScheduler(Scheduler):
    """The engine's ``Scheduler``, each preempted request offered to ``swap``
    once freed (the engine's ``tiers.swap_out`` call, at the same point)."""

    def __init__(self, manager: KVCacheManager, *, swap: SimSwap, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.swap = swap

    def _swap_out(self, request: Request) -> None:
        self.swap.swap_out(request, self.manager.hasher)


def swap_of(
    tiers: TierReplay | None, options: SimOptions, cost: CostModel, policy: CachePolicy
) -> SimSwap | None:
    """The replay's ``SimSwap``: None without a host tier or under ``recompute``
    (the scheduler is then the engine's, unchanged)."""
    if tiers is None or not may_swap(options.preemption_mode):
        return None
    load = profile_load_cost(cost, options.max_num_batched_tokens)
    return SimSwap(tiers.cache, options.preemption_mode, load, policy)


def scheduler_for(
    manager: KVCacheManager,
    swap: SimSwap | None,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    defer_pending_hits: bool,
) -> Scheduler:
    """The engine's ``Scheduler`` (no swap), or a ``SwapScheduler`` over ``swap``."""
    if swap is None:
        return Scheduler(
            manager,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            defer_pending_hits=defer_pending_hits,
        )
    return SwapScheduler(
        manager,
        swap=swap,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        defer_pending_hits=defer_pending_hits,
    )
