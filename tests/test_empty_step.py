"""A step that allocates nothing returns the manager's one shared empty result
(as vLLM's ``empty_kv_cache_blocks``), whose groups cannot be changed."""

from __future__ import annotations

import pytest
from factories import admit, decode, full, manager, req, swa

from hybridkv import KVCacheBlocks


def test_nothing_allocated_is_the_shared_immutable_empty_result() -> None:
    kv = manager(32, full(4), swa(4, 8))
    r = req("a", 6)
    _, new = admit(kv, r)
    assert new.get_block_ids() == ([1, 2], [3, 4])
    empty = kv.empty_kv_cache_blocks()
    assert decode(kv, r, 7) is empty  # tokens 7 and 8 fit in block 2: nothing new
    assert decode(kv, r, 8) is empty
    assert empty.get_block_ids() == ([], [])
    with pytest.raises(AttributeError):
        empty.blocks[0].append(kv.block_pool.blocks[5])  # type: ignore[union-attr]
    grown = decode(kv, r, 9)  # token 9 needs a third block per group
    assert grown is not None and grown is not empty
    assert grown.get_block_ids() == ([5], [6])
    one = KVCacheBlocks(([kv.block_pool.blocks[1]], []))
    assert (one + empty).get_block_ids() == ([1], [])
    kv.check_integrity()
