"""Spare room in the simulator's tiers (``TierIndex``, ``TieredCache.sync``).

A unit ``hybrid`` released ``evict_first`` is offered to the host as ``SPARE``
(``HybridPolicy.demotion_value``, the engine's decision): the host takes it
when it has free bytes or older spare units to drop, never in place of a valued
unit, and drops it first. Checked against a naive reference on seeded random
stores and touches, by hand on the rules, through ``sync`` (the demotion path
a replay takes) and over a short replay against the device's own decisions.
"""

from __future__ import annotations

import random

import pytest

from hybridkv.layouts import shipped_layout
from hybridkv.planning import plan_kv_cache
from hybridkv.policy.cost_aware import released_value
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace
from hybridkv.sim.tier_index import TierIndex
from hybridkv.sim.tier_model import TieredCache
from hybridkv.tiers.spare import SPARE


class Reference:
    """Valued units with their keys, spare units in use order; the rules of
    ``tiers/spare.py`` written out plainly."""

    def __init__(self, budget: int, weight: float) -> None:
        self.budget, self.weight = budget, weight
        self.valued: dict[int, tuple[int, int, float]] = {}
        self.spare: list[tuple[int, int]] = []  # (key, bytes), least recently used first
        self.clock = 0

    def used(self) -> int:
        return sum(u[0] for u in self.valued.values()) + sum(n for _, n in self.spare)

    def key(self, cls: int) -> float:
        return self.clock / self.budget + self.weight * cls / 2

    def spare_bytes(self, key: int) -> int | None:
        return next((n for k, n in self.spare if k == key), None)

    def touch(self, key: int) -> None:
        nbytes = self.spare_bytes(key)
        if nbytes is not None:
            self.spare.remove((key, nbytes))
            self.spare.append((key, nbytes))
            return
        n, cls, _ = self.valued.pop(key)
        self.valued[key] = (n, cls, self.key(cls))

    def store(self, key: int, nbytes: int, cls: int | None) -> list[int] | None:
        held_spare = self.spare_bytes(key)
        if key in self.valued:
            if cls is not None:
                n = self.valued.pop(key)[0]
                self.clock += n  # a valued store again counts its bytes
                self.valued[key] = (n, cls, self.key(cls))
            return []
        if held_spare is not None:
            if cls is None:
                self.touch(key)
            else:
                self.spare.remove((key, held_spare))
                self.clock += held_spare
                self.valued[key] = (held_spare, cls, self.key(cls))
            return []
        if nbytes > self.budget:
            return None
        free = self.budget - self.used()
        spare_victims = []
        for k, n in self.spare:
            if free >= nbytes:
                break
            spare_victims.append((k, n))
            free += n
        if free < nbytes and cls is None:
            return None  # no spare room: nothing changes
        order = sorted(self.valued, key=lambda k: (self.valued[k][2], self.valued[k][1]))
        valued_victims = []
        while free < nbytes:
            k = order.pop(0)
            valued_victims.append(k)
            free += self.valued[k][0]
        for k, n in spare_victims:
            self.spare.remove((k, n))
        for k in valued_victims:
            del self.valued[k]
        if cls is None:
            self.spare.append((key, nbytes))
        else:
            self.clock += nbytes
            self.valued[key] = (nbytes, cls, self.key(cls))
        return [k for k, _ in spare_victims] + valued_victims


@pytest.mark.parametrize("weight", [0.0, 2.0])
@pytest.mark.parametrize("seed", range(4))
def test_spare_units_match_the_reference(weight: float, seed: int) -> None:
    rng = random.Random(seed)
    tier, ref = TierIndex("host", 1000, weight), Reference(1000, weight)
    for _ in range(500):
        key = rng.randrange(40)
        held = key in ref.valued or ref.spare_bytes(key) is not None
        if held and rng.random() < 0.3:
            tier.touch(key)
            ref.touch(key)
        else:
            cls = None if rng.random() < 0.4 else (rng.randrange(-2, 6) if weight else 0)
            nbytes = rng.choice([50, 120, 300, 1200])
            got = tier.store(key, nbytes, cls)
            want = ref.store(key, nbytes, cls)
            assert (None if got is None else [k for k, _ in got]) == want
        tier.check_integrity()
        assert set(tier.spare) == {k for k, _ in ref.spare}
        assert {k for k, u in tier.units.items() if u.cls is not None} == set(ref.valued)
        assert tier.used_bytes == ref.used()
    assert tier.spare_stores > 0 and tier.spare_skips > 0


def test_a_spare_unit_takes_free_room_and_never_a_valued_units() -> None:
    tier = TierIndex("host", 300, 2.0)
    assert tier.store("valued", 100, -6) == []  # as cheap as a class gets here
    assert tier.store("spare", 100, None) == []  # free bytes: taken
    assert tier.store("spare2", 100, None) == []
    # Full: a spare unit may drop an older spare unit, never the valued one,
    # however low its class and however old.
    assert [k for k, _ in tier.store("spare3", 100, None)] == ["spare"]
    assert tier.store("big-spare", 300, None) is None  # would need the valued unit's bytes
    assert "valued" in tier and "spare2" in tier and "spare3" in tier
    assert tier.spare_skips == 1 and tier.evictions == 1
    tier.check_integrity()


def test_spare_room_is_free_bytes_plus_the_spare_units() -> None:
    tier = TierIndex("host", 400, 2.0)
    tier.store("valued", 200, -4)
    tier.store("s1", 100, None)
    tier.store("s2", 100, None)
    assert [k for k, _ in tier.store("s3", 200, None)] == ["s1", "s2"]
    assert tier.store("s4", 300, None) is None  # 200 spare bytes, the valued unit stays
    assert "valued" in tier and "s3" in tier and tier.spare_skips == 1
    tier.check_integrity()


def test_spare_units_are_the_first_victims_and_keep_no_clock() -> None:
    tier = TierIndex("host", 300, 0.0)  # plain LRU among the valued
    tier.store("old", 100, 0)
    tier.store("spare", 100, None)
    clock = tier.stored_bytes
    tier.store("spare-newer", 100, None)
    assert tier.stored_bytes == clock  # spare units advance nothing
    # A valued store drops the spare units first, least recently used first,
    # though "old" is the least recent of all.
    tier.touch("spare")
    assert [k for k, _ in tier.store("new", 100, 0)] == ["spare-newer"]
    assert [k for k, _ in tier.store("newer", 100, 0)] == ["spare"]
    assert [k for k, _ in tier.store("newest", 100, 0)] == ["old"]
    tier.check_integrity()


def test_a_later_value_wins_upward_only() -> None:
    tier = TierIndex("host", 200, 2.0)
    tier.store("a", 100, None)
    tier.store("a", 100, 3)  # valued now: no longer a first victim
    assert "a" not in tier.spare and tier.units["a"].cls == 3
    tier.store("b", 100, 3)
    key_b = tier.units["b"].key
    tier.store("b", 100, None)  # a spare offer of a valued unit changes nothing
    assert tier.units["b"].cls == 3 and tier.units["b"].key == key_b
    assert tier.store("c", 100, None) is None  # both valued: no spare room
    tier.check_integrity()


def _cache(host: int, disk: int | None) -> TieredCache:
    config = plan_kv_cache(shipped_layout("tiny-jamba"), 3 << 20, block_size=16).kv_cache_config
    return TieredCache(
        config, [], [{} for _ in config.kv_cache_groups], 1 << 16,
        device_profile("h100"), host, disk, False, 2.0,
    )  # fmt: skip


def test_sync_demotes_an_evict_first_unit_into_room_and_never_over_a_valued_one() -> None:
    probe = _cache(1 << 30, None)
    gid = max(range(len(probe.unit_bytes)), key=lambda g: probe.unit_bytes[g])
    unit = probe.unit_bytes[gid]
    cache = _cache(2 * unit, 10 * unit)
    # Room for two units: an evict-first unit is demoted beside a valued one.
    cache.sync([], [[(gid, b"valued", 8.0)], [(gid, b"first", SPARE)]])
    assert (b"first", gid) in cache.host and (b"valued", gid) in cache.host
    assert cache.demoted == 2 and cache.host.spare_stores == 1
    # A valued unit drops the evict-first one first, and it goes no lower.
    cache.sync([], [[(gid, b"valued2", 1.0)]])
    assert (b"first", gid) not in cache.host and (b"first", gid) not in cache.disk  # type: ignore[operator]
    assert (b"valued", gid) in cache.host and (b"valued2", gid) in cache.host
    # Full of valued units: an evict-first unit is not demoted, however low their
    # value, and nothing moves to disk.
    cache.sync([], [[(gid, b"first2", SPARE)]])
    assert (b"first2", gid) not in cache.host and cache.host.spare_skips == 1
    assert (b"valued2", gid) in cache.host and len(cache.disk) == 0  # type: ignore[arg-type]
    cache.check_integrity()


def _conversations(write_trace):  # type: ignore[no-untyped-def]
    """200 requests over 40 prompts' prefixes of 40-240 tokens."""
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 30000) for _ in range(240)] for _ in range(40)]
    rows = [
        {
            "timestamp": 50 * i,
            "prompt_token_ids": rng.choice(prompts)[: rng.randrange(40, 240)],
            "output_length": 8,
        }
        for i in range(200)
    ]
    return load_trace(write_trace(rows))


def test_a_replay_demotes_with_the_policys_values_into_spare_room(write_trace, monkeypatch) -> None:
    """A ``hybrid`` replay with a host tier that never fills (tiny Llama 4,
    whose chunked groups release passed chunks ``evict_first``): every value it
    demotes with is ``HybridPolicy.demotion_value``'s (``SPARE`` for a block
    released ``evict_first``), and spare units are stored, never skipped."""
    from hybridkv.policy.hybrid import HybridPolicy

    values: list[float | None] = []
    demotion_value, sync = HybridPolicy.demotion_value, TieredCache.sync

    def spy(self, block):  # type: ignore[no-untyped-def]
        value = demotion_value(self, block)
        assert value == (SPARE if released_value(block) is None else released_value(block))
        values.append(value)
        return value

    synced = [0]  # values asked for up to the last sync

    def checked_sync(self, events, taken):  # type: ignore[no-untyped-def]
        # the demoted units since the last sync: the values asked for, None left out
        got = sorted(v for batch in taken for *_, v in batch)
        assert got == sorted(v for v in values[synced[0] :] if v is not None)
        synced[0] = len(values)
        sync(self, events, taken)
        self.check_integrity()

    monkeypatch.setattr(HybridPolicy, "demotion_value", spy)
    monkeypatch.setattr(TieredCache, "sync", checked_sync)
    layout = shipped_layout("tiny-llama4")
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params=1e9)
    options = SimOptions(
        memory_bytes=1 << 20,
        policy="hybrid",
        host_memory_bytes=1 << 34,
        max_num_seqs=4,
        max_model_len=248,
        # no reach: a host this large keeps none of the return bonus, and the
        # values would be rescaled (``test_sim_return_reach.py``)
        tuning="return_bonus_tokens=0",
    )
    result = replay_trace(layout, _conversations(write_trace), options, cost)
    tiers = result.tiers
    assert tiers is not None
    assert SPARE in values and any(v is not None and v > 0 for v in values)
    assert tiers.host_spare_stores > 0 and tiers.host_spare_skips == 0
    assert tiers.host_spare_stores <= values.count(SPARE)
