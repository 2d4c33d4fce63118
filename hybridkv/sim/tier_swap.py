"""``SimSwap``: swap preemption in ``hybridkv simulate`` (``--preemption-mode``).

The engine's decision (``hybridkv/offload/swap.py``), called, not copied.
When the scheduler preempts a running request, before its blocks are freed
(``SwapScheduler._preempt``):

1. ``may_swap(mode)``: ``"recompute"`` never swaps;
2. ``swap_point``: the longest hit of at most its computed tokens (and one
   short of all its tokens) whose units are each on the device or in a tier,
   by the coordinator's rule; ``swap_units``: the units that hit needs (the
   full-attention blocks, the window's, the chunk's, the Mamba state at the
   point: a Mamba group resumes from its last kept state);
3. ``worth_swapping``: ``"swap"`` always; None (the default, as the engine
   with ``preemption_mode`` unset) when ``LoadCost`` finds ``2 * load(bytes)``
   (out now, back on resume) below ``recompute(point)``.

The ``LoadCost`` is the engine's class with the device profile's figures:
its load bandwidth is the profile's host->device link
(``DeviceProfile.host_to_device_bandwidth``), and its seconds per prefill
token come from one modeled step fed through ``LoadCost.observe_step`` as the
engine feeds its measured ones: a prefill of ``max_num_batched_tokens``
tokens from position 0 (``CostModel.step``). Like the engine's figure it is
linear in tokens (a long context's recompute costs more), which errs toward
recomputing.

A swap stores in the host tier the units of the swap point that no tier
holds yet (``TieredCache.store_host``: under ``hybrid`` with the value class
of the engine's value, ``point / units`` prefill tokens saved per unit, scaled
to the unit's bytes as demotion does, and the host's victims going to disk;
under ``lru`` class 0, plain LRU). Units a tier holds already are not copied
again (nor touched), as in the engine. Stores cost no modeled time (a
device-to-host copy off the critical path, as demotion and write-through
here). On resume the request is an ordinary waiting one: its device hit, then
what the tiers hold past it, loaded (``TierReplay``: ``reloaded_tokens``); a
unit the host evicted meanwhile is recomputed from there.

Figures (``TierFigures``): ``swaps``, ``swaps_declined`` (the cost model chose
recompute), ``swapped_units`` / ``swapped_bytes`` (new stores),
``swapped_tokens`` (swap points summed) and ``swap_saved_s``: for each swap,
``recompute(point) - 2 * load(bytes of its units)`` as ``LoadCost`` estimated
it at the decision. It is the engine's estimate, not what the replay saved:
where the device still holds a swapped request's blocks at its resume (freed,
not yet reused), nothing is reloaded and nothing was saved, and under
``recompute`` a resume reloads whatever demotion put in the tiers too. The
realized effect is the makespan and TTFT against a ``--preemption-mode
recompute`` run.
"""

from __future__ import annotations

from typing import Any

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.scheduler import Scheduler
from hybridkv.offload.load_cost import LoadCost, LoadCostPrior
from hybridkv.offload.swap_decision import may_swap, swap_point, swap_units, worth_swapping
from hybridkv.policy import value_class
from hybridkv.sim.cost_model import CostModel
from hybridkv.sim.options import SimOptions
from hybridkv.sim.tier_model import TieredCache
from hybridkv.sim.tier_replay import TierReplay


def profile_load_cost(cost: CostModel, max_num_batched_tokens: int) -> LoadCost:
    """The engine's ``LoadCost`` with ``cost``'s device figures (module docstring)."""
    load = LoadCost(cuda=True, prior=LoadCostPrior(cuda=cost.device.host_to_device_bandwidth))
    n = max_num_batched_tokens
    load.observe_step(n, n, cost.step([(0, n)]).seconds)
    return load


class SimSwap:
    """Swap preemption over one replay's tiers (module docstring)."""

    def __init__(self, cache: TieredCache, mode: str | None, load_cost: LoadCost) -> None:
        may_swap(mode)  # a bad mode is a ValueError here, before any replay
        self.cache = cache
        self.mode = mode
        self.load_cost = load_cost
        self.swaps = self.swaps_declined = 0
        self.swapped_units = self.swapped_bytes = self.swapped_tokens = 0
        self.swap_saved_s = 0.0

    def figures(self) -> dict[str, Any]:
        """``TierFigures``' swap fields."""
        return {
            "swaps": self.swaps,
            "swaps_declined": self.swaps_declined,
            "swapped_units": self.swapped_units,
            "swapped_bytes": self.swapped_bytes,
            "swapped_tokens": self.swapped_tokens,
            "swap_saved_s": self.swap_saved_s,
        }

    def _present(self, gid: int, i: int, h: bytes) -> bool:
        cache = self.cache
        return h in cache.device_cached[gid] or any((h, gid) in t for t in cache.tiers)

    def swap_out(self, request: Request, hasher: Any) -> bool:
        """``request`` is being preempted (its blocks not freed yet): store its
        swap point's units in the host if the mode or the cost model says so.
        True if it was swapped."""
        if not may_swap(self.mode):
            return False
        request.bind_hasher(hasher)
        cache = self.cache
        point = swap_point(cache.managers, request, self._present)
        if point == 0:
            return False
        units = swap_units(cache.managers, request.live_block_hashes, point)
        unit_bytes = cache.unit_bytes
        nbytes = sum(unit_bytes[gid] for gid, _, _ in units)
        cost = self.load_cost
        if not worth_swapping(self.mode, cost, nbytes, point):
            self.swaps_declined += 1
            return False
        per_unit = point / max(1, len(units))
        for gid, _, h in units:
            key = (h, gid)
            if any(key in t for t in cache.tiers):
                continue
            cls = 0 if cache.write_through else value_class(per_unit) + cache.class_shift[gid]
            if cache.store_host(key, gid, cls):
                self.swapped_units += 1
                self.swapped_bytes += unit_bytes[gid]
        self.swaps += 1
        self.swapped_tokens += point
        recompute = cost.recompute_seconds(point)
        if recompute is not None:
            self.swap_saved_s += recompute - 2 * cost.load_seconds(nbytes)
        return True


class SwapScheduler(Scheduler):
    """The engine's ``Scheduler``, each preempted request first offered to
    ``swap`` (the engine's ``tiers.swap_out`` call, at the same point)."""

    def __init__(self, manager: KVCacheManager, *, swap: SimSwap, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.swap = swap

    def _preempt(self, req: EngineRequest) -> None:
        self.swap.swap_out(req.core, self.manager.hasher)
        super()._preempt(req)


def swap_of(tiers: TierReplay | None, options: SimOptions, cost: CostModel) -> SimSwap | None:
    """The replay's ``SimSwap``: None without a host tier or under ``recompute``
    (the scheduler is then the engine's, unchanged)."""
    if tiers is None or not may_swap(options.preemption_mode):
        return None
    load = profile_load_cost(cost, options.max_num_batched_tokens)
    return SimSwap(tiers.cache, options.preemption_mode, load)


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
