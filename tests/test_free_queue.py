"""``FreeKVCacheBlockQueue``: the bulk operations match their one-by-one forms."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.free_queue import FreeKVCacheBlockQueue


def _ids(q: FreeKVCacheBlockQueue) -> list[int]:
    q.check_integrity()
    return [b.block_id for b in q]


@given(start=st.integers(0, 5), added=st.integers(0, 5), left=st.booleans())
def test_extend_matches_one_by_one(start: int, added: int, left: bool) -> None:
    bulk_blocks = [KVCacheBlock(i) for i in range(start + added)]
    one_blocks = [KVCacheBlock(i) for i in range(start + added)]
    bulk = FreeKVCacheBlockQueue(bulk_blocks[:start])
    one = FreeKVCacheBlockQueue(one_blocks[:start])
    if left:
        bulk.extendleft(bulk_blocks[start:])
        for b in one_blocks[start:]:
            one.appendleft(b)
    else:
        bulk.extend(bulk_blocks[start:])
        for b in one_blocks[start:]:
            one.append(b)
    assert _ids(bulk) == _ids(one)
    assert bulk.num_free_blocks == start + added


def test_extendleft_by_hand() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    q = FreeKVCacheBlockQueue(blocks[:1])
    q.extendleft(blocks[1:])
    assert _ids(q) == [3, 2, 1, 0]
    assert q.popleft_n(2) == [blocks[3], blocks[2]]
    q.extend(blocks[2:4])
    assert _ids(q) == [1, 0, 2, 3]


@given(keys=st.lists(st.integers(0, 6), max_size=8), n=st.integers(0, 9), limit=st.integers(-1, 7))
def test_popleft_keyed_is_popleft_n_of_the_run_at_most_limit(
    keys: list[int], n: int, limit: int
) -> None:
    """``popleft_keyed`` pops what ``popleft_n`` would, up to the first key above ``limit``."""
    queues = []
    for _ in range(2):
        blocks = [KVCacheBlock(i) for i in range(len(keys))]
        for b, k in zip(blocks, keys, strict=True):
            b.evict_key = float(k)
        queues.append(FreeKVCacheBlockQueue(blocks))
    keyed, plain = queues
    run = next((i for i, k in enumerate(keys) if k > limit), len(keys))
    got = [b.block_id for b in keyed.popleft_keyed(n, float(limit))]
    assert got == [b.block_id for b in plain.popleft_n(min(n, run))]
    assert _ids(keyed) == _ids(plain)
    assert keyed.num_free_blocks == plain.num_free_blocks
