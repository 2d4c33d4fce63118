"""The return bonus's reach in prompt tokens (``HybridTuning.return_bonus_tokens``,
``policy.returning.host_return_share``): a host tier (``HybridOptions.tier_cover``,
set by ``for_host_tier``) caps a returning unit's whole stay, one host turnover plus
its bonus, at the reach: a demoted unit's return factor is raised to the host's
share of the bonus (``host_return_share``, ``host_value``), its other class steps
kept; the device keeps the bonus. Off, the bonus counts turnovers of whatever pool
holds it."""

from __future__ import annotations

import pytest
from factories import config
from test_hybrid_policy import FULL, SWA, run

from hybridkv import KVCacheManager
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.cost_aware import released_value, tier_value_class, unit_class
from hybridkv.policy.options import for_host_tier
from hybridkv.policy.returning import host_return_share, host_value


def test_the_host_keeps_a_share_of_the_bonus() -> None:
    assert host_return_share(4.0, 0, 100, 5.0) == 1.0  # off
    assert host_return_share(4.0, 1000, 100, 1.0) == 1.0  # no host
    assert host_return_share(0.0, 1000, 100, 5.0) == 1.0  # no bonus to share
    # A host that holds a whole stay (1 + 4 turnovers) within the reach: the bonus.
    assert host_return_share(4.0, 1000, 100, 2.0) == 1.0  # 100 host tokens
    assert host_return_share(4.0, 1000, 200, 2.0) == 1.0  # exactly 5 stays of 200
    # 400 host tokens: a stay of 2.5 turnovers, a bonus of 1.5 of the device's 4.
    assert host_return_share(4.0, 1000, 100, 5.0) == 0.375
    assert host_return_share(4.0, 1000, 250, 5.0) == 0.0  # a host as large as the reach
    assert host_return_share(4.0, 1000, 500, 5.0) == 0.0  # and larger: no bonus
    # The device's size counts only through the host's (400 host tokens either way).
    assert host_return_share(4.0, 1000, 200, 3.0) == 0.375
    assert host_return_share(2.0, 1000, 400, 2.0) == 0.75  # a bonus of 2: 1.5 of it
    # Below the cap, a returning unit's whole stay in tokens is the reach at any size:
    stays = {(1 + 4.0 * host_return_share(4.0, 1000, h, 2.0)) * h for h in (250, 400, 500)}
    assert stays == {1000.0}


def test_the_host_value_rescales_the_return_factor_alone() -> None:
    # A factor of 16 (4 turnovers at weight 1) at a share of 1/4: 16 ** -3/4 = 1/8.
    assert host_value(24.0, 16.0, 0.25) == pytest.approx(3.0)
    assert host_value(24.0, 1.0, 0.25) == 24.0  # not returning: the value as it is
    assert host_value(24.0, 16.0, 1.0) == 24.0  # the whole bonus kept
    assert host_value(0.5, 4.0, 0.5) == pytest.approx(0.25)  # under one: the same ratio


def test_a_tier_keeps_a_share_of_a_one_class_bonus() -> None:
    """A tier's class is the value's half-octaves, not floored: a class's own
    value (what the device demotes) gives it exactly; a returning unit's factor
    rescaled by the host keeps its fraction. Weight 8, bonus 4 (llama-4-scout's):
    the factor is 2 ** 0.5, one class; a host share of 0.77 keeps 0.77 of it
    (floored, it kept none)."""
    assert [tier_value_class(2.0 ** (k / 2)) for k in range(-40, 121)] == list(range(-40, 121))
    v = host_value(2.0 ** (7 / 2), 2.0**0.5, 0.77)
    assert tier_value_class(v) == pytest.approx(7 - 0.23)
    assert tier_value_class(host_value(2.0 ** (7 / 2), 2.0**0.5, 0.38)) == pytest.approx(7 - 0.62)
    # Shifted to the unit's bytes by whole classes, as before: a unit of a quarter page.
    assert unit_class(v, 256, 1024) == pytest.approx(7 - 0.23 + 4)
    assert unit_class(None, 1024, 1024) == 0  # no value: the neutral one
    with pytest.raises(ValueError, match="value must be > 0"):
        tier_value_class(0.0)


def test_for_host_tier_records_the_host_size() -> None:
    assert HybridOptions().tier_cover == 1.0
    assert for_host_tier(None, 40, 0).tier_cover == 1.0
    assert for_host_tier(None, 40, 160).tier_cover == 5.0
    assert for_host_tier(HybridOptions(return_bonus=2), 40, 320).tier_cover == 9.0
    with pytest.raises(ValueError, match=r"tier_cover must be a finite number >= 1, got 0.5"):
        HybridOptions(tier_cover=0.5)


def kv(num_blocks: int, reach: int, cover: float = 1.0, bonus: float = 4.0) -> KVCacheManager:
    tuning = HybridTuning(return_bonus_tokens=reach)
    return KVCacheManager(
        config(num_blocks, FULL, SWA),
        256,
        cache_policy="hybrid",
        hybrid=HybridOptions(value_weight=1.0, return_bonus=bonus, tuning=tuning, tier_cover=cover),
    )


@pytest.mark.parametrize(
    ("num_blocks", "reach", "cover", "host_share"),
    [
        (64, 0, 1.0, 1.0),  # off
        (64, 0, 8.0, 1.0),  # off, with a host: turnovers of each pool
        (64, 64 * 4 * 4, 1.0, 1.0),  # no host
        (64, 64 * 4 * 4, 1.5, 1.0),  # a host of an eighth of the reach: the whole bonus
        (64, 64 * 4 * 4, 2.0, 0.75),  # a quarter: a stay of 4 turnovers, a bonus of 3
        (64, 64 * 4 * 4, 3.0, 0.25),  # a half: a stay of 2 turnovers, a bonus of 1
        (64, 64 * 4 * 4, 5.0, 0.0),  # as large as the reach: no bonus
        (128, 64 * 4 * 4, 1.0, 1.0),  # a device twice as large keeps its bonus
        (128, 64 * 4 * 4, 2.0, 0.25),  # its host holds half the reach: a bonus of 1
    ],
)
def test_the_policy_shares_the_host_bonus_only(num_blocks, reach, cover, host_share) -> None:
    # FULL's blocks are 4 tokens: the pool holds num_blocks x 4 full-attention tokens.
    m = kv(num_blocks, reach, cover)
    assert m.policy.return_bonus == 4.0  # the device's, in its turnovers, always
    assert m.policy.return_factor == 2.0**4  # weight 1
    assert m.policy.host_return_share == pytest.approx(host_share)
    m.check_integrity()


def demoted(m: KVCacheManager) -> dict[int, tuple[int, float | None]]:
    """Each keyed free block's ``(device class, value offered to a tier)``."""
    return {
        b.block_id: (b.free_class, m.policy.demotion_value(b))
        for b in m.block_pool.policy
        if b.free_class is not None
    }


def keys(m: KVCacheManager) -> dict[int, float]:
    return {b.block_id: b.evict_key for b in m.block_pool.policy if b.free_class is not None}


def two_turns(m: KVCacheManager) -> set[int]:
    """A (32 tokens) then B = A + 4 tokens, returning (``test_returning.py``'s
    worked example), then C, a first turn of other tokens; the ids of the
    blocks B released last (keyed anew by its free)."""
    assert run(m, "a", list(range(32))) == 0
    before = keys(m)
    assert run(m, "b", [*range(32), *range(100, 104)]) == 32
    by_b = {i for i, key in keys(m).items() if before.get(i) != key}
    assert run(m, "c", list(range(200, 232))) == 0
    return by_b


def test_a_demoted_unit_keeps_its_classes_and_a_share_of_its_return_factor() -> None:
    """Weight 1, bonus 4 (factor 16); a host of half the reach of 64 x 4 x 4
    tokens (cover 3): a stay of 2 host turnovers, so the host keeps 1 of 4, a
    factor of 16 ** 1/4 = 2. B's
    units (returning) reach the tier at their class's value / 8 (3 octaves, 6
    half-octave classes lower: 3 turnovers at weight 1); A's that B left and
    C's (first turns) at their class's value, exactly as without the reach."""
    off, on = kv(64, 0, 3.0), kv(64, 64 * 4 * 4, 3.0)
    by_b = two_turns(off)
    assert two_turns(on) == by_b
    got_off, got_on = demoted(off), demoted(on)
    assert got_on.keys() == got_off.keys() and by_b < got_on.keys()
    for block_id, (cls, value) in got_on.items():
        assert got_off[block_id] == (cls, 2.0 ** (cls / 2))  # the device alike; off: the class
        want = 2.0 ** (cls / 2) / (8.0 if block_id in by_b else 1.0)
        assert value == pytest.approx(want)
    on.check_integrity()


def test_a_block_freed_since_without_a_value_keeps_its_class_value() -> None:
    """A returning unit's block released again without a value (a staged load's
    held blocks are freed so) is offered at its new class's value: the return
    factor it was marked with belongs to its earlier class."""
    m = kv(64, 64 * 4 * 4, 3.0)
    free_set = m.block_pool.policy
    by_b = two_turns(m)
    block = next(b for b in free_set if b.block_id in by_b)
    assert m.policy.demotion_value(block) < released_value(block)  # marked: its share
    free_set.remove(block)
    free_set.release([block])  # no value: the neutral class
    assert block.free_class == 0
    assert m.policy.demotion_value(block) == released_value(block) == 1.0
    m.check_integrity()


def test_keywords_keep_the_host_size() -> None:
    tiered = for_host_tier(None, 40, 160)
    assert HybridOptions.from_knobs(tiered, hybrid_return_bonus=2).tier_cover == 5.0
