"""``uncache_uncomputed``: a failed step's blocks leave the prefix cache, nothing else does."""

from __future__ import annotations

import pytest
from factories import full, hit_len, manager, req, swa


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
