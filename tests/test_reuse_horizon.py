"""The reuse horizon (``hybridkv.policy.reuse_horizon``): the sliding maximum of
return gaps, the release times that give them, and the free set dropping the
value bonus of blocks released longer ago than the horizon."""

from __future__ import annotations

import pytest
from factories import chunked, full

from hybridkv import CostAwareEvictionPolicy
from hybridkv.core.block import KVCacheBlock
from hybridkv.policy import HybridOptions, eviction_factory
from hybridkv.policy.reuse_horizon import ReleaseTimes, ReuseHorizon
from hybridkv.policy.tuning import HybridTuning


def test_horizon_is_the_largest_of_the_last_window_gaps() -> None:
    h = ReuseHorizon(window=3, min_observed=2)
    h.observe(5)
    assert h.horizon is None  # one gap, two needed
    for gap in (3, 9):
        h.observe(gap)
    assert h.horizon == 9
    h.observe(1)  # window 3, 9, 1
    assert h.horizon == 9
    h.observe(2)
    h.observe(2)  # window 1, 2, 2: the 9 has left it
    assert h.horizon == 2
    h.check_integrity()
    with pytest.raises(ValueError, match="window and min_observed"):
        ReuseHorizon(window=0, min_observed=1)


def test_release_times_give_the_gap_of_the_deepest_sample() -> None:
    times = ReleaseTimes(capacity=100, stride=2)
    a = [bytes([i]) for i in range(8)]  # chained hashes of one prompt
    times.record(a, 4, now=10)  # samples a[1], a[3]
    times.record(a[:2], 2, now=30)  # a[1] released again
    # A continuation of a: its deepest sample a[3] was released at 10.
    assert times.gap([*a, b"x", b"y"], now=50) == 40
    assert times.gap(a[:3], now=50) == 20  # only a[1] in reach: released at 30
    assert times.gap([b"z"] * 4, now=50) is None
    times.check_integrity()


def test_release_times_forget_the_older_generation() -> None:
    times = ReleaseTimes(capacity=4, stride=1)
    times.record([b"a", b"b", b"c"], 3, now=1)  # 3 > 2: becomes the older generation
    times.record([b"d", b"e", b"f"], 3, now=2)  # a, b, c forgotten
    assert times.gap([b"a"], now=5) is None
    assert times.gap([b"f"], now=5) == 3
    times.check_integrity()


def free_set(reuse: ReuseHorizon | None) -> tuple[CostAwareEvictionPolicy, list[KVCacheBlock]]:
    """Four blocks, weight 1: b1 valued 16 (class 8, a bonus of 4 turnovers)
    released first, then b2, b3, b4 at value 1 (class 0)."""
    blocks = [KVCacheBlock(i) for i in range(1, 5)]
    policy = CostAwareEvictionPolicy(blocks, weight=1.0, reuse=reuse)
    policy.take(4)
    for b in blocks:
        b.block_hash = bytes([b.block_id])
    policy.release([blocks[0]], value=16.0)
    policy.release(blocks[1:], value=1.0)
    return policy, blocks


def test_a_block_older_than_the_horizon_loses_its_bonus() -> None:
    # No horizon: b1's bonus keeps it past the three younger blocks.
    policy, _ = free_set(None)
    assert [b.block_id for b in policy] == [2, 3, 4, 1]
    assert [b.block_id for b in policy.take(4)] == [2, 3, 4, 1]
    # A horizon of 2 releases: b1 (released 3 ago) has outlived it and goes
    # first, keyed by its release alone; b2 (2 ago) is within it.
    reuse = ReuseHorizon(window=4, min_observed=1)
    reuse.observe(2)
    policy, _ = free_set(reuse)
    assert [b.block_id for b in policy] == [1, 2, 3, 4]
    policy.check_integrity()
    assert [b.block_id for b in policy.take(2)] == [1, 2]
    # A horizon longer than b1's age leaves its bonus.
    reuse = ReuseHorizon(window=4, min_observed=1)
    reuse.observe(3)
    policy, _ = free_set(reuse)
    assert [b.block_id for b in policy.take(4)] == [2, 3, 4, 1]


def test_switch_off_builds_no_horizon() -> None:
    specs = [full(4), chunked(4, 8)]
    blocks = [KVCacheBlock(i) for i in range(4)]
    for on in (True, False):
        opts = HybridOptions(tuning=HybridTuning(learn_reuse_horizon=on))
        factory = eviction_factory("hybrid", opts, specs, True)
        assert factory is not None
        ranking = factory(blocks)
        assert isinstance(ranking, CostAwareEvictionPolicy)
        assert (ranking.reuse is not None) is on


def test_margin_stretches_the_horizon() -> None:
    h = ReuseHorizon(window=4, min_observed=1, margin=1.25)
    h.observe(8)
    assert h.horizon == 10
    with pytest.raises(ValueError, match="margin must be >= 1"):
        ReuseHorizon(window=4, min_observed=1, margin=0.5)
    with pytest.raises(ValueError, match="tuning reuse_margin must be >= 1"):
        HybridTuning(reuse_margin=0.5)
