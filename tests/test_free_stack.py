"""``FreeBlockStack``: the same reuse order as the linked queue's ``*left`` operations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.free_queue import FreeKVCacheBlockQueue
from hybridkv.core.free_stack import FreeBlockStack

# One operation: ("push", k) pushes k new blocks at once, ("one", 0) one block,
# ("pop", k) pops up to k, ("remove", i) removes the i-th free block (mod size).
_OPS = st.lists(
    st.tuples(st.sampled_from(["push", "one", "pop", "remove"]), st.integers(0, 6)), max_size=30
)


@given(start=st.integers(0, 6), ops=_OPS)
def test_stack_matches_the_linked_queue(start: int, ops: list[tuple[str, int]]) -> None:
    mine = [KVCacheBlock(i) for i in range(200)]
    theirs = [KVCacheBlock(i) for i in range(200)]
    stack = FreeBlockStack(mine[:start])
    queue = FreeKVCacheBlockQueue(theirs[:start])
    nxt = start
    for op, k in ops:
        if op == "push":
            stack.extendleft(mine[nxt : nxt + k])
            queue.extendleft(theirs[nxt : nxt + k])
            nxt += k
        elif op == "one":
            stack.appendleft(mine[nxt])
            queue.appendleft(theirs[nxt])
            nxt += 1
        elif op == "pop":
            k = min(k, queue.num_free_blocks)
            got = [b.block_id for b in stack.popleft_n(k)]
            assert got == [b.block_id for b in queue.popleft_n(k)]
        elif queue.num_free_blocks:
            bid = list(queue)[k % queue.num_free_blocks].block_id
            stack.remove(mine[bid])
            queue.remove(theirs[bid])
        stack.check_integrity()
        assert [b.block_id for b in stack] == [b.block_id for b in queue]
        assert stack.num_free_blocks == queue.num_free_blocks


def test_stack_by_hand() -> None:
    b = [KVCacheBlock(i) for i in range(600)]
    s = FreeBlockStack(b[:2])  # reuse order 0, 1
    s.extendleft(b[2:4])  # 3 is reused first
    s.appendleft(b[4])
    assert [x.block_id for x in s] == [4, 3, 2, 0, 1]
    assert s.popleft_n(0) == []
    assert s.popleft_n(2) == [b[4], b[3]]
    s.remove(b[0])
    assert [x.block_id for x in s] == [2, 1]
    with pytest.raises(ValueError, match="not in the free stack"):
        s.remove(b[0])
    with pytest.raises(ValueError, match="asked for 3 blocks, 2 free"):
        s.popleft_n(3)
    # Deep removal: past the window searched first.
    s.extendleft(b[5:600])
    s.remove(b[2])
    assert s.num_free_blocks == 596
    assert list(s)[-1] is b[1]
    assert b[2] not in list(s)


def test_check_integrity_catches_a_block_twice() -> None:
    b = [KVCacheBlock(i) for i in range(2)]
    s = FreeBlockStack(b)
    s.appendleft(b[0])
    with pytest.raises(AssertionError, match="twice"):
        s.check_integrity()
