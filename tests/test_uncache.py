"""``uncache_uncomputed``: a failed step's blocks leave the prefix cache, nothing else does."""

from __future__ import annotations

import pytest
from factories import full, hit_len, mamba, manager, req, swa


def test_only_blocks_past_the_computed_tokens_are_uncached() -> None:
    kv = manager(64, full(4), swa(4, 8))
    a = req("a", 16)
    assert kv.allocate_slots(a, 8) is not None
    a.num_computed_tokens = 8  # step 1 computed tokens 0-7
    assert kv.allocate_slots(a, 8) is not None  # step 2 (tokens 8-15) fails
    assert kv.uncache_uncomputed(a) == 4  # blocks 2 and 3 of both groups
    kv.check_integrity()
    kv.free(a)
    kv.check_integrity()
    assert hit_len(kv, req("b", 16)) == 8  # blocks 0-1 stay cached


def test_a_free_block_cannot_be_uncached() -> None:
    kv = manager(8, full(4))
    with pytest.raises(ValueError, match="is free"):
        kv.block_pool.uncache(kv.block_pool.blocks[3])


def test_null_and_partial_entries_are_not_counted() -> None:
    """``hybrid`` (no tail) Mamba tables hold null entries past the computed tokens (no state
    there); the last, partial blocks have no hash. 30 tokens on blocks of 4: full
    attention caches blocks 0-6 (block 7 is partial); Mamba keeps entries 6 (the
    last boundary, 28) and 7 (the running state, partial): 7 + 1 uncached."""
    kv = manager(64, full(4), mamba(4), cache_policy="hybrid", hybrid_tail_tokens=0)
    a = req("a", 30)
    assert kv.allocate_slots(a, 30) is not None
    assert [i for i, b in enumerate(kv.get_block_ids("a")[1]) if b] == [6, 7]
    assert kv.uncache_uncomputed(a) == 8
    kv.check_integrity()
    assert not kv.block_pool.cached[0] and not kv.block_pool.cached[1]
