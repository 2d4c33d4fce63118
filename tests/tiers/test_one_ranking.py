"""The engine's host tier and the simulator's ``TierIndex`` rank by one rule.

``tiers/ranking.py`` is the rule; the engine's ``HostTier`` runs it through a
``RankedLedger``, the simulator through ``TierIndex``. Driven by the same
seeded sequence of stores (valued, spare, again) and hits, both must hold the
same units and evict the same ones, in the same order, with the engine's
host rule (``offload.tier_ranking``: a hit moves the unit to spare room) and
with the disk's (a hit re-keys it). A worked example pins the rule itself.
"""

from __future__ import annotations

import random
from functools import partial

import pytest
from tier_factories import fingerprint, key

from hybridkv.policy import unit_class
from hybridkv.sim.tier_index import TierIndex
from hybridkv.tiers import HostTier, RankRule, UnitKey
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.spare import SPARE, is_spare

PAGE = 64  # bytes of one device block id: the classes' reference
VALUES = [SPARE, None, 1.0, 1.5, 2.0, 5.0, 40.0]


class Pair:
    """One engine host tier and one simulator tier, fed the same operations."""

    def __init__(self, budget: int, weight: float, hits_to_spare: bool) -> None:
        rule = RankRule(weight, partial(unit_class, page_bytes=PAGE), hits_to_spare)
        self.engine = HostTier(fingerprint(), budget, copier=InlineCopier(), ranking=rule)
        self.gone: list[UnitKey] = []
        self.engine.on_removed = self.gone.append
        self.sim = TierIndex("host", budget, weight, hits_to_spare)

    def store(self, k: UnitKey, nbytes: int, value: float | None) -> list[UnitKey]:
        """Store in both; the engine's evictions, checked against the simulator's."""
        self.gone.clear()
        self.engine.store(k, [bytes(nbytes)], value=value).wait()
        cls = None if is_spare(value) else unit_class(value, nbytes, PAGE)
        victims = self.sim.store(k, nbytes, cls)
        assert self.gone == [v for v, _ in victims or []]
        return list(self.gone)

    def hit(self, k: UnitKey) -> None:
        load = self.engine.load(k)
        assert load is not None and load.wait()
        self.sim.touch(k)

    def check(self) -> None:
        assert set(self.engine.keys()) == set(self.sim.units)
        assert self.engine.used_bytes == self.sim.used_bytes
        self.engine.check_integrity()
        self.sim.check_integrity()


@pytest.mark.parametrize("hits_to_spare", [True, False])
@pytest.mark.parametrize("weight", [0.5, 2.0])
@pytest.mark.parametrize("seed", range(3))
def test_engine_and_simulator_evict_the_same_units(
    seed: int, weight: float, hits_to_spare: bool
) -> None:
    rng = random.Random(seed)
    pair = Pair(1000, weight, hits_to_spare)
    evicted = 0
    for _ in range(400):
        i = rng.randrange(40)
        k = key(i)
        if k in pair.sim and rng.random() < 0.4:
            pair.hit(k)
        else:  # a unit's bytes are its key's
            evicted += len(pair.store(k, (50, 120, 300)[i % 3], rng.choice(VALUES)))
        pair.check()
    assert evicted > 50 and pair.sim.spare_skips > 0


def test_the_rule_worked_through() -> None:
    """Keys ``clock / budget + weight * class / 2`` (weight 2, classes against a
    64-byte page): a valued store counts its bytes, a store again too, a hit
    nothing; the host's hit moves the unit to spare room, the first victim."""
    pair = Pair(300, 2.0, hits_to_spare=True)
    a, b, c, d, e = (key(i) for i in range(5))
    pair.store(a, 64, 4.0)  # class 4, key 64 / 300 + 4
    pair.store(b, 64, 1.0)  # class 0, key 128 / 300
    pair.store(c, 128, 1.0)  # 128-byte unit: class -2, key 256 / 300 - 2
    assert pair.store(d, 64, 1.0) == [c]  # the lowest key; d's is 320 / 300
    pair.store(b, 64, 1.0)  # demoted again: counted, re-keyed at 384 / 300
    pair.hit(a)  # on the device now: spare in the host
    assert pair.sim.units[a].cls is None and pair.sim.stored_bytes == 384
    assert pair.store(e, 200, 1.0) == [a, d]  # spare first, then the lowest key
    pair.check()


def test_a_store_again_spills_with_its_new_value() -> None:
    """A unit demoted again with another value is ranked by it, and goes down to
    the disk with it, as the simulator's victim keeps its last class (the entry
    once kept its first store's value, so the disk ranked it by that)."""
    pair = Pair(128, 2.0, hits_to_spare=True)
    spilled: list[tuple[UnitKey, float | None]] = []
    pair.engine.spill = lambda k, parts, value: spilled.append((k, value))
    a, b, c = key(0), key(1), key(2)
    pair.store(a, 64, 8.0)
    pair.store(b, 64, 2.0)
    pair.store(a, 64, 1.0)  # again, worth less now: under b
    assert pair.store(c, 64, 2.0) == [a]
    assert spilled == [(a, 1.0)]
    pair.check()
