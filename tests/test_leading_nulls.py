"""``num_leading_nulls`` and the pool's use of it: a window's hit, mostly null blocks."""

from __future__ import annotations

import pytest

from hybridkv.core.block import KVCacheBlock, num_leading_nulls
from hybridkv.core.block_pool import BlockPool


def test_counts_only_the_nulls_before_the_first_real_block() -> None:
    pool = BlockPool(6, 1)
    null, a, b = pool.null_block, pool.blocks[1], pool.blocks[2]
    assert num_leading_nulls([], null) == 0
    assert num_leading_nulls([a, b], null) == 0
    assert num_leading_nulls([null, null, a, b], null) == 2
    assert num_leading_nulls([null, null], null) == 2
    assert num_leading_nulls([null, a, null, b, null], null) == 1  # nulls past a real one
    assert num_leading_nulls([a, null], null) == 0


def test_touch_skips_leading_nulls_and_counts_the_rest() -> None:
    pool = BlockPool(6, 1)
    null = pool.null_block
    blocks: list[KVCacheBlock] = pool.get_new_blocks(2)
    pool.free_blocks(blocks[::-1])  # free again, ref count 0
    pool.touch([null, null, blocks[0], null, blocks[1]])
    assert null.ref_cnt == 0
    assert [b.ref_cnt for b in blocks] == [1, 1]
    pool.check_integrity()


def test_freeing_a_free_block_is_an_error() -> None:
    pool = BlockPool(4, 1)
    (b,) = pool.get_new_blocks(1)
    pool.free_blocks([pool.null_block, b])
    with pytest.raises(AssertionError, match="freed more often"):
        pool.free_blocks([b])
