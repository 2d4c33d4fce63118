"""``get_num_blocks_to_allocate`` counts free hit blocks exactly, whatever the
hit list looks like (the bisection over leading null blocks is only a shortcut)."""

from __future__ import annotations

from factories import full, manager, swa
from hypothesis import given
from hypothesis import strategies as st


# Each entry: 0 the null block, 1 a free block (ref count 0), 2 a held one.
@given(kinds=st.lists(st.integers(0, 2), max_size=40), sliding=st.booleans())
def test_free_hit_blocks_match_brute_force(kinds: list[int], sliding: bool) -> None:
    kv = manager(64, full(4), swa(4, 8))
    m = kv.coordinator.managers[1 if sliding else 0]
    pool = kv.block_pool
    blocks = []
    for i, k in enumerate(kinds):
        if k == 0:
            blocks.append(pool.null_block)
        else:
            b = pool.blocks[i + 1]
            b.ref_cnt = k - 1
            blocks.append(b)
    want = sum(1 for b in blocks if not b.is_null and b.ref_cnt == 0)
    assert m._num_free_hit_blocks(blocks) == want


def test_free_hit_blocks_by_hand() -> None:
    kv = manager(16, full(4), swa(4, 8))
    m = kv.coordinator.managers[1]
    pool = kv.block_pool
    null, a, b, c = pool.null_block, *pool.blocks[1:4]
    a.ref_cnt, b.ref_cnt, c.ref_cnt = 0, 1, 0
    assert m._num_free_hit_blocks([null, null, null, a, b]) == 1
    assert m._num_free_hit_blocks([null, a, null, b, c]) == 2  # a null after a block
    assert m._num_free_hit_blocks([a, null, null, c]) == 2
    assert m._num_free_hit_blocks([null, null]) == 0
