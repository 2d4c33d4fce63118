"""Growing every group's table at once changes no block: ``BlockPool.get_new_blocks_each``
against one ``get_new_blocks`` per table, and ``TableGrowth`` on decode steps."""

from __future__ import annotations

import random
from functools import partial

import pytest
from factories import config, decode, full, manager, prefill, req, swa
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.core.eviction import LRUEvictionPolicy
from hybridkv.policy.cost_aware import CostAwareEvictionPolicy


class _NewestFirst(LRUEvictionPolicy):
    """A subclass with its own ``take`` (the queue's tail first)."""

    def take(self, n: int) -> list[KVCacheBlock]:
        out = []
        for _ in range(n):
            b = self.queue.tail.prev_free
            assert b is not None
            self.queue.remove(b)
            out.append(b)
        return out


POLICIES = {
    "lru": None,
    "cost-aware": partial(CostAwareEvictionPolicy, weight=0.5),
    "own-take": _NewestFirst,
}


def _pool(policy: str, events: bool, seed: int) -> BlockPool:
    """A pool of 40 blocks after a seeded history of takes, caching (with
    duplicate keys) and frees in every release mode."""
    pool = BlockPool(40, 2, enable_kv_cache_events=events, eviction_policy=POLICIES[policy])
    rng = random.Random(seed)
    held: list[list[KVCacheBlock]] = []
    for _ in range(60):
        if rng.random() < 0.55 and pool.num_free_blocks:
            blocks = pool.get_new_blocks(rng.randint(1, min(4, pool.num_free_blocks)))
            hashes = [bytes([rng.randrange(8)]) for _ in blocks]
            tokens = list(range(2 * len(blocks)))
            stop = rng.randint(0, len(blocks))
            pool.cache_run(blocks, hashes, rng.randrange(2), tokens, 2, 0, stop)
            held.append(blocks)
        elif held:
            blocks = held.pop(rng.randrange(len(held)))
            mode = rng.randrange(3)
            pool.free_blocks(reversed(blocks), evict_first=mode == 0, value=[None, None, 3.0][mode])
    pool.take_events()
    return pool


def _note(calls: list[list[int]], blocks: list[KVCacheBlock]) -> None:
    calls.append([b.block_id for b in blocks])


def _state(pool: BlockPool) -> tuple:
    pool.check_integrity()
    index = [sorted((h, b.block_id) for h, b in g.items()) for g in pool.cached]
    dups = sorted((k, sorted(d)) for k, d in pool.duplicates.items())
    refs = [b.ref_cnt for b in pool.blocks]
    return (
        [b.block_id for b in pool.policy],
        index,
        dups,
        refs,
        pool.generation,
        (pool.num_evicted_blocks),
        pool.take_events(),
    )


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    events=st.booleans(),
    watched=st.booleans(),
    seed=st.integers(0, 10_000),
    counts=st.lists(st.integers(0, 3), min_size=1, max_size=6),
)
def test_get_new_blocks_each_is_one_get_new_blocks_per_table(
    policy: str, events: bool, watched: bool, seed: int, counts: list[int]
) -> None:
    each, one = _pool(policy, events, seed), _pool(policy, events, seed)
    seen: tuple[list[list[int]], list[list[int]]] = ([], [])
    if watched:  # a lower tier watching each take sees the same calls
        for pool, calls in zip((each, one), seen, strict=True):
            pool.on_take = partial(_note, calls)
    counts = [min(n, each.num_free_blocks // len(counts)) for n in counts]
    got = each.get_new_blocks_each(counts)
    want = [one.get_new_blocks(n) if n else [] for n in counts]
    assert [[b.block_id for b in g] for g in got] == [[b.block_id for b in g] for g in want]
    assert _state(each) == _state(one)
    assert seen[0] == seen[1]


def _gemma_like(policy: str, events: bool = False) -> KVCacheManager:
    """Five sliding groups and one full group of one block size (Gemma 3's layout)."""
    specs = [swa(4, 12)] * 5 + [full(4)]
    return KVCacheManager(
        config(200, *specs), 256, cache_policy=policy, enable_kv_cache_events=events
    )


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_a_decode_step_across_a_block_takes_one_block_per_group_in_group_order(
    policy: str,
) -> None:
    kv = _gemma_like(policy)
    assert kv.coordinator.growth.uniform
    r = req("r", 8)
    prefill(kv, r)  # 8 tokens: 2 blocks per group
    before = [b.block_id for b in kv.block_pool.policy][:6]
    calls = []
    real = kv.coordinator.growth.extend
    kv.coordinator.growth.extend = lambda *a: calls.append((a[2], a[4])) or real(*a)  # type: ignore[method-assign]
    new = decode(kv, r, 1)  # 9 tokens need a third block in every group
    assert new is not None and calls == [(1, False)]  # one token, nothing released
    assert [ids for ids in new.get_block_ids()] == [[i] for i in before]
    assert kv._quiet.horizons["r"][0] == 12
    kv.check_integrity()


@pytest.mark.parametrize("events", [False, True])
def test_a_decode_step_that_fills_a_block_caches_it_in_every_group(events: bool) -> None:
    kv = _gemma_like("lru", events)
    r = req("r", 7)
    prefill(kv, r)
    kv.take_events()
    assert decode(kv, r, 1) is not None  # 8 tokens: block 1 is full in every group
    tables = kv.get_blocks("r").blocks
    assert all(t[1].block_hash == r.block_hashes[1] for t in tables)
    assert len(kv.take_events()) == (6 if events else 0)
    assert kv._quiet.horizons["r"][2] == 12
    kv.check_integrity()


def test_uniform_tables_of_one_length_are_checked() -> None:
    kv = _gemma_like("lru")
    r = req("r", 8)
    prefill(kv, r)
    kv.coordinator.managers[2].states["r"].num_cached -= 1
    with pytest.raises(AssertionError, match="uniform groups' tables differ"):
        kv.check_integrity()


def test_groups_of_two_block_sizes_are_not_uniform() -> None:
    assert not manager(40, full(4), swa(8, 16)).coordinator.growth.uniform
