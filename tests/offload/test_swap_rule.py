"""The swap rule (``offload/swap_decision.py``): copy only what the pool's reuse
would lose, into spare room only; the engine and the simulator decide alike.

On a planned tiny Jamba layout (32-token blocks in every group), a request is
freed as the scheduler frees a preempted one, then offered to the swap:

- under ``hybrid`` the pool demotes its blocks when it reuses them, so with
  a fast link nothing is copied; the pool then reuses every block and the
  resume still hits its whole swap point, from the host (demotion made the copy
  a swap would have made);
- under ``lru`` (nothing written through yet: the units are lost on reuse) the
  copies go to the host as spare: with the host full of valued units they are
  skipped, no valued unit is evicted and nothing reaches the disk; with room
  they are stored, and a later valued store evicts them first;
- the engine's ``Swap.plan`` and the simulator's ``SimSwap.plan`` give the
  same plan on the same state (the same manager, the same tier keys), for
  each policy and mode, a unit held by a running request included.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from factories import admit, toks
from tier_helpers import assert_restored, computed, evict_and_wipe, fill, tiered_manager

from hybridkv import KVCacheManager, Request
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.offload.swap_decision import Decision, SwapPlan
from hybridkv.sim.devices import device_profile
from hybridkv.sim.tier_model import TieredCache as SimTieredCache
from hybridkv.sim.tier_swap import SimSwap
from hybridkv.tiers import UnitKey
from hybridkv.tiers.memory import HostMemory

MAX_LEN = 128
MakeMemory = Callable[[BlockBytes, int], HostMemory]


def _preempted(kv: object, rid: str, tokens: list[int], computed_to: int) -> Request:
    """A request admitted, computed to ``computed_to`` and freed, as the scheduler
    preempts one before offering it to the swap."""
    r = Request(rid, tokens)
    admit(kv, r)  # type: ignore[arg-type]
    r.num_computed_tokens = computed_to
    kv.free(r)  # type: ignore[attr-defined]
    return r


def test_a_fast_link_copies_nothing_the_pool_demotes_on_reuse(host_memory: MakeMemory) -> None:
    kv, buffers, tiers, _ = tiered_manager(
        "tiny-jamba", policy="hybrid", max_len=MAX_LEN, make_memory=host_memory
    )
    tiers.cost.observe_step(100, 100, 100.0)  # recompute: 1 s a token; the link: fast
    r = Request("a", toks(96 + 8))
    admit(kv, r)
    r.num_computed_tokens = 96
    want = fill(kv, tiers, r)
    kv.free(r)
    plan = tiers.swap.plan(r, None)
    assert plan is not None and plan.decision is Decision.UNNEEDED and plan.point > 0
    forced = tiers.swap.plan(r, "swap")
    assert forced is not None and forced.decision is Decision.SWAP and forced.copies
    assert not tiers.swap_out(r, None)
    assert tiers.stats.swaps == 0 and tiers.stats.swaps_unneeded == 1
    assert tiers.host.keys() == []
    evict_and_wipe(kv, buffers)  # the pool reuses every block before the resume
    r.num_computed_tokens = 0
    assert tiers.prepare(r, wait=True)
    blocks, resumed = kv.get_computed_blocks(r)
    assert resumed == plan.point  # demotion kept what a swap would have copied
    assert_restored(tiers, blocks, want)
    tiers.check_integrity()
    kv.check_integrity()
    tiers.close()


def _lru_with_host_of(
    extra_units: int, host_memory: MakeMemory, disk: Path
) -> tuple[object, object, list[UnitKey]]:
    """An ``lru`` engine whose host holds request ``r0``'s units written through
    (valued), with room for ``extra_units`` units of each group besides."""
    # The host bytes of r0's units and of one unit per group, as this memory counts them.
    pkv, _, probe, _ = tiered_manager("tiny-jamba", max_len=MAX_LEN, make_memory=host_memory)
    used = []
    for r in (Request("r0", toks(64 + 8, 5000)), Request("one", toks(32 + 8, 3000))):
        admit(pkv, r)
        computed(probe, r)
        probe.pending.wait_all()
        used.append(probe.host.used_bytes)
    probe.close()
    kv, _, tiers, _ = tiered_manager(
        "tiny-jamba",
        max_len=MAX_LEN,
        make_memory=host_memory,
        host_bytes=used[0] + extra_units * (used[1] - used[0]),
        disk=disk,
    )
    r0 = Request("r0", toks(64 + 8, 5000))
    admit(kv, r0)
    computed(tiers, r0)  # two blocks per group written through
    kv.free(r0)
    tiers.pending.wait_all()
    valued = sorted(tiers.host.keys())
    assert len(valued) == 2 * len(tiers.block_bytes.unit_bytes)
    tiers.cost.observe_step(100, 100, 100.0)  # recompute dear: a copy is worth it
    return kv, tiers, valued


def test_with_room_only_in_spare_no_valued_unit_is_evicted(
    host_memory: MakeMemory, tmp_path: Path
) -> None:
    kv, tiers, valued = _lru_with_host_of(0, host_memory, tmp_path)
    r = _preempted(kv, "a", toks(48 + 8), 48)
    plan = tiers.swap.plan(r, None)
    assert plan is not None and plan.decision is Decision.SWAP and len(plan.copies) == 2
    assert tiers.swap_out(r, None)
    tiers.pending.wait_all()
    assert tiers.stats.swapped_units == 0 and tiers.host.stats.spare_skips == 2
    assert sorted(tiers.host.keys()) == valued  # nothing valued made room for them
    assert tiers.disk is not None and tiers.disk.keys() == []  # nor did they spill
    tiers.check_integrity()
    tiers.close()


def test_with_free_room_copies_are_stored_as_spare(host_memory: MakeMemory, tmp_path: Path) -> None:
    kv, tiers, valued = _lru_with_host_of(1, host_memory, tmp_path)
    r = _preempted(kv, "a", toks(48 + 8), 48)
    assert tiers.swap_out(r, None)
    tiers.pending.wait_all()
    copies = set(tiers.host.keys()) - set(valued)
    assert len(copies) == 2 and tiers.stats.swapped_units == 2
    # A later valued store that needs their room evicts the spare copies, not
    # r0's older valued units (plain LRU would evict those).
    r2 = Request("r2", toks(32 + 8, 9000))
    admit(kv, r2)
    computed(tiers, r2)
    kv.free(r2)
    tiers.pending.wait_all()
    held = set(tiers.host.keys())
    assert held.isdisjoint(copies) and set(valued) <= held
    tiers.check_integrity()
    tiers.close()


def _sim_plan(
    kv: KVCacheManager, tiers: TieredCache, mode: str | None, r: Request
) -> SwapPlan | None:
    """The simulator's plan for ``r`` on ``kv``'s device state, its host holding
    the engine host's keys."""
    cache = SimTieredCache(
        kv.kv_cache_config,
        kv.coordinator.managers,
        kv.block_pool.cached,
        1 << 16,
        device_profile("h100"),
        1 << 30,
        None,
        kv.coordinator.policy.writes_through,
        0.0,
    )
    assert cache.unit_bytes == tiers.block_bytes.unit_bytes
    assert tiers.host is not None
    held = tiers.host.keys()
    for key in held:
        assert (
            cache.host.store((key.block_hash, key.group_id), cache.unit_bytes[key.group_id], 0)
            == []
        )
    sim = SimSwap(cache, mode, tiers.cost, kv.coordinator.policy)
    return sim.plan(r, kv.hasher)


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
@pytest.mark.parametrize("mode", [None, "swap", "recompute"])
@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("seconds_per_token", [1.0, 1e-12])
def test_the_engine_and_the_simulator_plan_alike(
    policy: str, mode: str | None, held: bool, seconds_per_token: float
) -> None:
    kv, _, tiers, _ = tiered_manager("tiny-jamba", policy=policy, max_len=MAX_LEN)
    tiers.cost.observe_step(100, 100, 100 * seconds_per_token)
    prefix = toks(64)
    r0 = Request("r0", prefix + toks(8, 5000))
    admit(kv, r0)
    computed(tiers, r0)  # lru: the shared prefix written through (in a tier)
    kv.free(r0)
    tiers.pending.wait_all()
    r = Request("a", prefix + toks(40, 7000))
    admit(kv, r)
    r.num_computed_tokens = 96
    if held:  # a running request shares r's blocks: they stay held
        other = Request("b", prefix + toks(40, 7000) + toks(8, 9000))
        admit(kv, other)
    kv.free(r)
    engine = tiers.swap.plan(r, mode)
    assert engine == _sim_plan(kv, tiers, mode, r)
    if mode == "recompute":
        assert engine is None
    elif mode == "swap":
        assert engine is not None and engine.decision is Decision.SWAP
    elif policy == "hybrid" or held:
        assert engine is not None and engine.decision is Decision.UNNEEDED
    else:  # lru: the prefix is in the host, the rest would be lost on reuse
        assert engine is not None and engine.point == 96
        assert engine.saved_tokens == 96 - 64  # the hit without the lost units: the prefix
        if seconds_per_token == 1.0:
            assert engine.decision is Decision.SWAP and engine.copies
        else:
            assert engine.decision is Decision.DECLINED and not engine.copies
    tiers.close()
