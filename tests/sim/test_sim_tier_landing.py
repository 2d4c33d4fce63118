"""A host hit's copy moves to spare room when its load lands, not at admission.

Under ``hybrid`` a host hit's unit goes to spare room because the device
holds it (``TierIndex.touch``). In the simulator a load passes over the
chunks it replaces, so the device holds the units only once it has passed
(``TieredCache.landed``). A request preempted before that must find the
host's copies still valued when it resumes.
"""

from __future__ import annotations

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.planning import plan_kv_cache
from hybridkv.sim import device_profile
from hybridkv.sim.tier_model import TieredCache
from hybridkv.sim.tier_replay import TierReplay

LAYOUT = shipped_layout("tiny-jamba")


def _setup(write_through: bool) -> tuple[TieredCache, Request]:
    plan = plan_kv_cache(LAYOUT, 3 << 20, block_size=16)
    manager = KVCacheManager(plan.kv_cache_config, 256)
    managers = manager.coordinator.managers
    cache = TieredCache(
        plan.kv_cache_config, managers, manager.block_pool.cached, plan.page_bytes,
        device_profile("h100"), 1 << 30, None, write_through, 2.0,
    )  # fmt: skip
    req = Request("r", list(range(200)))
    assert manager.get_computed_blocks(req)[1] == 0  # hashes the prompt; nothing on the device
    for m in managers:  # the host holds every unit of the prompt, valued
        for h in m.group_hashes(req.block_hashes):
            cache.host.store((h, m.group_id), cache.unit_bytes[m.group_id], 4)
    return cache, req


def test_the_host_copies_stay_valued_until_the_load_lands() -> None:
    cache, req = _setup(write_through=False)
    tiers = TierReplay(cache, [], step_overhead_s=0.0, tables=lambda rid: ())
    load = cache.admit(req.block_hashes, req.num_tokens - 1, 0)
    assert load is not None and load.total > 64 and load.host_units
    units = cache.host.units
    assert all(units[k].cls == 4 for k in load.host_units)  # not on the device yet
    tiers.loading["r"] = load
    tiers.clip([("r", 0, 32)])  # part of the load has passed
    assert all(units[k].cls == 4 for k in load.host_units)
    tiers.clip([("r", 32, load.total)])  # landed: the device holds them
    assert "r" not in tiers.loading
    assert all(units[k].cls is None and k in cache.host.spare for k in load.host_units)
    cache.check_integrity()


def test_a_write_through_host_re_keys_at_admission() -> None:
    cache, req = _setup(write_through=True)
    load = cache.admit(req.block_hashes, req.num_tokens - 1, 0)
    assert load is not None and load.host_units == ()
    assert all(u.cls == 4 for u in cache.host.units.values())  # re-keyed, still valued
    cache.check_integrity()
