"""``BlockPool.num_evicted_blocks``: cached blocks reused, counted once each (with
events on or off, primary or duplicate); an uncache or a reset is not an eviction."""

from __future__ import annotations

import pytest

from hybridkv.core.block_pool import BlockPool


def _cached_pool(events: bool) -> BlockPool:
    """Blocks 1-4 free; 1 and 2 cached under keys a, b; 3 a duplicate of b; 4 uncached."""
    pool = BlockPool(5, 1, enable_kv_cache_events=events)
    blocks = pool.get_new_blocks(4)
    assert pool.num_evicted_blocks == 0  # nothing was cached yet
    pool.cache_run(blocks[:2], [b"a", b"b"], 0, [1, 2], 1, 0, 2)
    pool.cache_run(blocks[2:3], [b"b"], 0, [2], 1, 0, 1)
    pool.free_blocks(blocks)
    pool.take_events()
    assert pool.num_cached_blocks() == 3
    return pool


@pytest.mark.parametrize("events", [False, True])
def test_each_cached_block_taken_is_one_eviction(events: bool) -> None:
    pool = _cached_pool(events)
    pool.get_new_blocks(4)  # all of them: 3 cached (one a duplicate), 1 not
    assert pool.num_evicted_blocks == 3
    assert pool.num_cached_blocks() == 0
    pool.check_integrity()


@pytest.mark.parametrize("events", [False, True])
def test_uncache_and_reset_are_not_evictions(events: bool) -> None:
    pool = _cached_pool(events)
    (block,) = [b for b in pool.blocks if b.block_hash == b"a"]
    pool.touch([block])
    pool.uncache(block)
    pool.free_blocks([block])
    assert pool.reset_prefix_cache()
    assert pool.num_evicted_blocks == 0
    pool.get_new_blocks(4)  # nothing cached any more
    assert pool.num_evicted_blocks == 0
