"""``TierIndex`` and the demotion order of ``TieredCache``.

- Against a naive reference (every unit's key, smallest evicted first), on
  seeded random stores and touches: the same victims, the budget never
  exceeded, the integrity check after every operation.
- Weight 0 is plain LRU; with a weight, a unit of a lower value class leaves
  before an older one of a higher class, within the weight's reach.
- ``TieredCache.sync``: demotion ranks by the device's value class scaled per
  byte, what the host evicts lands on the disk with its class, a unit still on
  the device is not demoted; write-through stores every cached block in every
  tier.
"""

from __future__ import annotations

import random

import pytest

from hybridkv.core.events import BlockStored
from hybridkv.layouts import shipped_layout
from hybridkv.planning import plan_kv_cache
from hybridkv.sim import device_profile
from hybridkv.sim.tier_index import TierIndex
from hybridkv.sim.tier_model import TieredCache, unit_bytes


class Reference:
    """Every unit with its key; evict the smallest (key, class) first."""

    def __init__(self, budget: int, weight: float) -> None:
        self.budget, self.weight = budget, weight
        self.units: dict[int, tuple[int, int, float]] = {}
        self.clock = 0

    def key(self, cls: int) -> float:
        return self.clock / self.budget + self.weight * cls / 2

    def touch(self, key: int, cls: int | None = None) -> None:
        """Re-key ``key`` now; it moves last among equal keys (stable sort)."""
        nbytes, old_cls, _ = self.units.pop(key)
        cls = old_cls if cls is None else cls
        self.units[key] = (nbytes, cls, self.key(cls))

    def store(self, key: int, nbytes: int, cls: int) -> list[int] | None:
        if key in self.units:
            self.clock += self.units[key][0]  # a store again counts its bytes
            self.touch(key, cls)
            return []
        if nbytes > self.budget:
            return None
        used = sum(u[0] for u in self.units.values())
        order = sorted(self.units, key=lambda k: (self.units[k][2], self.units[k][1]))
        victims = []
        while used + nbytes > self.budget:
            victim = order.pop(0)
            used -= self.units.pop(victim)[0]
            victims.append(victim)
        self.clock += nbytes
        self.units[key] = (nbytes, cls, self.key(cls))
        return victims


@pytest.mark.parametrize("weight", [0.0, 1.0, 8.0])
@pytest.mark.parametrize("seed", range(4))
def test_victims_match_the_reference_and_the_budget_holds(weight: float, seed: int) -> None:
    rng = random.Random(seed)
    tier, ref = TierIndex("host", 1000, weight), Reference(1000, weight)
    for _ in range(400):
        key, cls = rng.randrange(60), rng.randrange(-2, 6) if weight else 0
        if key in ref.units and rng.random() < 0.5:
            tier.touch(key)
            ref.touch(key)
        else:
            nbytes = rng.choice([50, 120, 300, 1200])
            got = tier.store(key, nbytes, cls)
            want = ref.store(key, nbytes, cls)
            assert (None if got is None else [k for k, _ in got]) == want
        tier.check_integrity()
        assert tier.used_bytes <= tier.budget_bytes
        assert set(tier.units) == set(ref.units)
    assert tier.evictions > 0 and tier.refused > 0


def test_weight_zero_is_lru_and_a_weight_keeps_the_valuable() -> None:
    lru = TierIndex("host", 300, 0.0)
    for key in "abc":
        lru.store(key, 100, 0)
    lru.touch("a")
    assert [k for k, _ in lru.store("d", 100, 0)] == ["b"]

    ranked = TierIndex("host", 300, 2.0)
    ranked.store("old-valuable", 100, 4)
    ranked.store("cheap", 100, 0)
    ranked.store("valuable", 100, 4)
    # "cheap" is newer than "old-valuable" but four half-octaves cheaper.
    assert [k for k, _ in ranked.store("new", 100, 4)] == ["cheap"]
    assert [k for k, _ in ranked.store("newer", 100, 4)] == ["old-valuable"]
    ranked.check_integrity()


def test_a_unit_stored_again_counts_on_the_clock_and_a_hit_does_not() -> None:
    """The device's clock counts every release, a block released again after a
    hit too: a unit the device evicts again (a store of a held key) counts its
    bytes, so a unit used over and over outlasts an old one of a higher class,
    as it would on the device."""
    tier = TierIndex("host", 200, 2.0)
    tier.store("old-valuable", 100, 4)  # key 100 / 200 + 4
    tier.store("hot", 100, 0)  # key 200 / 200
    tier.touch("hot")  # a hit: re-keyed, nothing counted
    assert tier.stored_bytes == 200
    for _ in range(10):  # loaded, used, evicted by the device and demoted again
        assert tier.store("hot", 100, 0) == []
    assert tier.stored_bytes == 1200  # hot's key is now 6, past old-valuable's 4.5
    assert [k for k, _ in tier.store("new", 100, 0)] == ["old-valuable"]
    tier.check_integrity()


def test_a_hit_moves_the_unit_to_spare_room_until_the_device_demotes_it_again() -> None:
    """Under demotion (``hits_to_spare``) a host hit loads the unit onto the
    device: its host copy is kept in spare room only (evicted first, never in
    place of a valued unit) until the device evicts it and stores it again,
    which makes it valued and counts its bytes."""
    tier = TierIndex("host", 300, 2.0, hits_to_spare=True)
    tier.store("loaded", 100, 4)
    tier.store("cheap", 100, 0)
    tier.store("other", 100, 0)
    tier.touch("loaded")  # a hit: the device holds it now
    assert tier.units["loaded"].cls is None and "loaded" in tier.spare
    assert tier.stored_bytes == 300  # a hit counts nothing
    # It was the most valuable unit; now it is the first to go.
    assert [k for k, _ in tier.store("new", 100, 0)] == ["loaded"]
    tier.check_integrity()
    tier.store("again", 100, 4)  # evicts "cheap" (the oldest of the lowest keys)
    tier.touch("again")
    assert tier.store("again", 100, 6) == []  # demoted again: valued, counted, no copy
    assert tier.units["again"].cls == 6 and "again" not in tier.spare
    assert tier.stored_bytes == 600
    assert [k for k, _ in tier.store("newer", 100, 0)] == ["other"]
    tier.check_integrity()

    kept = TierIndex("disk", 200, 2.0)  # without it a hit re-keys the unit now
    kept.store("a", 100, 0)
    kept.store("b", 100, 0)
    kept.touch("a")
    assert kept.units["a"].cls == 0
    assert [k for k, _ in kept.store("c", 100, 0)] == ["b"]
    kept.check_integrity()


def _cache(host: int, disk: int | None, write_through: bool) -> TieredCache:
    layout = shipped_layout("tiny-jamba")
    config = plan_kv_cache(layout, 3 << 20, block_size=16).kv_cache_config
    return TieredCache(
        config, [], [{} for _ in config.kv_cache_groups], 1 << 16,
        device_profile("h100"), host, disk, write_through, 2.0,
    )  # fmt: skip


def test_demotion_ranks_by_value_and_cascades_to_disk() -> None:
    probe = _cache(1 << 30, None, False)
    ub = unit_bytes_of(probe)
    gid = max(range(len(ub)), key=lambda g: ub[g])  # the largest unit
    cache = _cache(2 * ub[gid], 10 * ub[gid], False)
    # A host hit's unit is on the device until it is demoted again; not so on disk.
    assert cache.host.hits_to_spare and not cache.disk.hits_to_spare  # type: ignore[union-attr]
    assert not _cache(1 << 30, None, True).host.hits_to_spare  # lru: write-through
    # Taken blocks come with the policy's demotion value: 8.0 is class 6, 1.0 class 0.
    taken = [[(gid, b"old-valuable", 8.0)], [(gid, b"cheap", 1.0)]]
    cache.sync([], taken)
    assert taken == []  # consumed
    assert cache.demoted == 2
    assert (b"old-valuable", gid) in cache.host and (b"cheap", gid) in cache.host
    cache.sync([], [[(gid, b"new", 8.0)]])  # newer than "old-valuable", as valuable: "cheap" goes
    assert (b"cheap", gid) in cache.disk  # type: ignore[operator]
    assert (b"old-valuable", gid) in cache.host and (b"new", gid) in cache.host
    unit = cache.disk.units[(b"cheap", gid)]  # type: ignore[union-attr]
    # its class goes down with it, shifted to the disk entry's bytes (a header more)
    assert (unit.nbytes, unit.cls) == cache.on_disk((b"cheap", gid), 0 + cache.class_shift[gid])
    assert unit.nbytes > ub[gid]
    # A copy on the device (a duplicate, or recomputed since the take) is demoted
    # all the same, as the engine stores it at the take.
    cache.device_cached[gid][b"kept"] = object()  # type: ignore[index]
    cache.sync([], [[(gid, b"kept", 16.0)]])
    assert (b"kept", gid) in cache.host
    cache.check_integrity()


def test_a_batch_never_evicts_its_own_units_and_overflows_to_disk() -> None:
    """One take's units are in flight together in the engine's host: a unit of
    the batch that finds only them to evict goes to disk (a valued one), not
    over them; the next batch may evict them."""
    probe = _cache(1 << 30, None, False)
    ub = unit_bytes_of(probe)
    gid = max(range(len(ub)), key=lambda g: ub[g])
    cache = _cache(2 * ub[gid], 10 * ub[gid], False)
    cache.sync([], [[(gid, b"a", 8.0), (gid, b"b", 1.0), (gid, b"c", 8.0)]])
    assert (b"a", gid) in cache.host and (b"b", gid) in cache.host  # "b" is not evicted
    assert (b"c", gid) in cache.disk and (b"c", gid) not in cache.host  # type: ignore[operator]
    assert cache.host.refused == 1
    cache.sync([], [[(gid, b"d", 8.0)]])  # a later batch: "b", the lowest, goes to disk
    assert (b"b", gid) in cache.disk and (b"d", gid) in cache.host  # type: ignore[operator]
    cache.check_integrity()


def test_write_through_stores_every_cached_block_in_every_tier() -> None:
    cache = _cache(1 << 20, 1 << 22, True)
    event = BlockStored([b"a", b"b"], None, list(range(32)), 16, None, 0)
    cache.sync([event], [[(0, b"evicted", 4.0)]])  # evictions are ignored
    for tier in cache.tiers:
        assert (b"a", 0) in tier and (b"b", 0) in tier and (b"evicted", 0) not in tier
    cache.check_integrity()


def unit_bytes_of(cache: TieredCache) -> list[int]:
    return cache.unit_bytes


def test_unit_bytes_are_real_pages_over_the_groups_layers() -> None:
    config = plan_kv_cache(shipped_layout("tiny-jamba"), 3 << 20, block_size=16).kv_cache_config
    sizes = unit_bytes(config)
    assert len(sizes) == len(config.kv_cache_groups) and all(s > 0 for s in sizes)


def test_the_seen_prompts_memory_covers_device_and_host() -> None:
    """Under a host tier, ``hybrid`` remembers the prompts device and host hold
    together: its ``SeenPrefixes`` grows by ``(device + host) / device``."""
    from hybridkv import KVCacheManager
    from hybridkv.policy import HybridOptions
    from hybridkv.policy.options import for_host_tier

    config = plan_kv_cache(shipped_layout("tiny-gemma3"), 3 << 20, block_size=16).kv_cache_config

    def capacity(options: HybridOptions) -> int:
        kv = KVCacheManager(config, 256, cache_policy="hybrid", hybrid=options)
        seen = kv.policy.seen  # type: ignore[attr-defined]
        assert seen is not None
        return int(seen.capacity)

    base = HybridOptions()
    assert for_host_tier(None, 40, 0) == base  # no host: unchanged
    tiered = for_host_tier(base, 40, 320)
    assert tiered.tuning.seen_per_block == 9 * base.tuning.seen_per_block
    assert capacity(tiered) == 9 * capacity(base)
    per_block = base.tuning.seen_per_block
    assert for_host_tier(base, 3, 1).tuning.seen_per_block == -(-per_block * 4 // 3)  # rounded up
    assert tiered.tail == base.tail and tiered.floor_tokens == base.floor_tokens  # only that
