"""One full-attention group (block size 4): prefill, decode, free, hit, evict.

Conventions: a pool of N blocks hands out 1..N-1 (0 is the null block), in id
order at first. ``free_ids`` lists the free queue head first (next reused).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from factories import (
    admit,
    cached_ids,
    decode,
    free_ids,
    full,
    hit_ids,
    hit_len,
    manager,
    ref_counts,
    req,
    toks,
)

from hybridkv import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheManager, Request
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.eviction import LRUEvictionPolicy


def test_prefill_decode_free_and_hit_with_exact_ids() -> None:
    kv = manager(10, full(4))  # usable blocks 1..9
    a = req("a", 10)  # tokens 100..109: [100-103][104-107][108-109]
    num_hit, new = admit(kv, a)
    assert num_hit == 0 and new.get_block_ids() == ([1, 2, 3],)
    assert kv.get_block_ids("a") == ([1, 2, 3],)
    assert free_ids(kv) == [4, 5, 6, 7, 8, 9]
    assert cached_ids(kv) == {1, 2}  # block 3 is partial
    # Decode: tokens 10 and 11 fit in block 3; it is cached once full.
    assert decode(kv, a, 110).get_block_ids() == ([],)  # type: ignore[union-attr]
    assert decode(kv, a, 111).get_block_ids() == ([],)  # type: ignore[union-attr]
    assert cached_ids(kv) == {1, 2, 3}
    # Token 12 opens block 4 (popped from the head).
    assert decode(kv, a, 112).get_block_ids() == ([4],)  # type: ignore[union-attr]
    assert kv.get_block_ids("a") == ([1, 2, 3, 4],)
    assert ref_counts(kv) == [0, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    kv.check_integrity()

    # Free, tail first: 4 (partial, hashless) -> head; 3, 2, 1 (hashed) -> tail.
    assert kv.free(a) is True
    assert free_ids(kv) == [4, 5, 6, 7, 8, 9, 3, 2, 1]
    assert kv.usage == 0.0
    kv.check_integrity()

    # B repeats A's 13 tokens: hit 12 (never the last token), blocks 1, 2, 3
    # leave the free queue; token 12 gets the head block, 4.
    b = req("b", 13)
    assert hit_ids(kv, b) == ([1, 2, 3],)
    num_hit, new = admit(kv, b)
    assert num_hit == 12 and new.get_block_ids() == ([4],)
    assert kv.get_block_ids("b") == ([1, 2, 3, 4],)
    assert free_ids(kv) == [5, 6, 7, 8, 9]
    kv.check_integrity()


def test_hit_never_covers_the_last_token() -> None:
    kv = manager(10, full(4))
    admit(kv, req("a", 8))  # blocks 1, 2 both full and cached
    assert hit_ids(kv, req("b", 8)) == ([1],)  # 8 tokens: at most 7 -> one block
    assert hit_len(kv, req("c", 9)) == 8
    assert hit_len(kv, req("d", 1)) == 0


@pytest.mark.parametrize("caching", [False, True])
def test_free_order_puts_hashless_blocks_at_the_head(caching: bool) -> None:
    kv = manager(8, full(4), enable_caching=caching)
    a, b = req("a", 10), req("b", toks(6, start=500))
    admit(kv, a)  # [1, 2, 3], block 3 partial
    admit(kv, b)  # [4, 5], block 5 partial
    assert free_ids(kv) == [6, 7]
    kv.free(a)
    kv.free(b)
    if caching:
        # free a: 3 -> head; 2, 1 -> tail      => [3, 6, 7, 2, 1]
        # free b: 5 -> head; 4 -> tail         => [5, 3, 6, 7, 2, 1, 4]
        assert free_ids(kv) == [5, 3, 6, 7, 2, 1, 4]
    else:
        # Nothing has a hash: a release's blocks go to the head in its order (vLLM's
        # prepend_n): 3, 2, 1 => [3, 2, 1, 6, 7]; then 5, 4 => [5, 4, 3, 2, 1, 6, 7]
        assert free_ids(kv) == [5, 4, 3, 2, 1, 6, 7]
        assert cached_ids(kv) == set()
    kv.check_integrity()


def test_duplicate_cached_blocks_are_allowed() -> None:
    kv = manager(6, full(4))  # blocks 1..5
    a, b = req("a", 8), req("b", 8)
    admit(kv, a)  # [1, 2]
    num_hit, new = admit(kv, b)  # 8 tokens hit only 4: block 1, then a new block 3
    assert num_hit == 4 and new.get_block_ids() == ([3],)
    assert kv.get_block_ids("b") == ([1, 3],)
    # Blocks 2 and 3 hold the same tokens under the same hash: both cached.
    assert cached_ids(kv) == {1, 2, 3}
    assert kv.block_pool.blocks[2].block_hash == kv.block_pool.blocks[3].block_hash
    assert ref_counts(kv) == [0, 2, 1, 1, 0, 0]
    kv.check_integrity()
    kv.free(a)  # 2 -> tail; 1 still held by b
    kv.free(b)  # 3, 1 -> tail
    assert free_ids(kv) == [4, 5, 2, 3, 1]
    assert hit_ids(kv, req("c", 9)) == ([1, 2],)  # the primary copy
    # X takes 3 blocks: 4, 5 and 2 (evicted). The duplicate 3 takes over.
    x = req("x", toks(12, start=500))
    admit(kv, x)
    assert kv.get_block_ids("x") == ([4, 5, 2],)
    assert hit_ids(kv, req("c", 9)) == ([1, 3],)
    kv.check_integrity()


def test_eviction_under_pressure_takes_the_tail_first() -> None:
    kv = manager(7, full(4), enable_kv_cache_events=True)  # blocks 1..6
    a = req("a", 12)
    admit(kv, a)  # [1, 2, 3], all full and cached
    hashes = a.block_hashes
    kv.free(a)
    assert free_ids(kv) == [4, 5, 6, 3, 2, 1]
    kv.take_events()
    # B needs 4 blocks: 4, 5, 6, then 3 -- A's tail -- is evicted.
    b = req("b", toks(16, start=500))
    admit(kv, b)
    assert kv.get_block_ids("b") == ([4, 5, 6, 3],)
    removed = [e for e in kv.take_events() if isinstance(e, BlockRemoved)]
    assert removed == [BlockRemoved(block_hashes=[hashes[2]], group_id=0)]
    again = req("a2", 13)  # A's 12 tokens and one more
    assert hit_ids(kv, again) == ([1, 2],)
    # B finishes: its 4 full blocks go to the tail, behind A's prefix.
    kv.free(b)
    assert free_ids(kv) == [2, 1, 3, 6, 5, 4]
    # C takes one block: 2, A's second block, is the least recently used.
    admit(kv, req("c", toks(3, start=900)))
    assert hit_ids(kv, again) == ([1],)
    assert hit_len(kv, req("b2", toks(17, start=500))) == 16
    kv.check_integrity()


class _FifoPolicy(LRUEvictionPolicy):
    """Every released block goes to the tail (no hashless-first rule)."""

    def release(self, blocks: Iterable[KVCacheBlock]) -> None:
        for b in blocks:
            self.queue.append(b)


def test_a_custom_eviction_policy_decides_the_reuse_order() -> None:
    # A's blocks 1, 2 (full, cached) and 3 (partial) are released tail first: 3, 2, 1.
    # The default policy puts hashless 3 at the head; a FIFO policy appends all three.
    for policy, queue in (
        (None, [3, 4, 5, 6, 7, 8, 9, 2, 1]),
        (_FifoPolicy, [4, 5, 6, 7, 8, 9, 3, 2, 1]),
    ):
        kv = manager(10, full(4), eviction_policy=policy)
        a = req("a", 10)
        admit(kv, a)
        kv.free(a)
        assert free_ids(kv) == queue, policy
        kv.check_integrity()


def test_hit_blocks_at_the_queue_head_are_taken_before_new_blocks_are_popped() -> None:
    kv = manager(5, full(4))  # blocks 1..4
    a = req("a", 8)
    admit(kv, a)
    kv.free(a)  # [3, 4, 2, 1]
    x = req("x", toks(8, start=500))
    admit(kv, x)  # pops 3, 4
    kv.free(x)  # 4, 3 -> tail: A's blocks are now at the head
    assert free_ids(kv) == [2, 1, 4, 3]
    # B = A's 8 tokens + 4: hit [1, 2]; its one new block must be 4, not 2.
    b = req("b", [*toks(8), *toks(4, start=700)])
    num_hit, new = admit(kv, b)
    assert (num_hit, new.get_block_ids()) == (8, ([4],))
    assert kv.get_block_ids("b") == ([1, 2, 4],)
    assert free_ids(kv) == [3]
    kv.check_integrity()


def test_failed_allocation_changes_nothing() -> None:
    kv = manager(5, full(4))  # blocks 1..4
    a = req("a", 12)
    admit(kv, a)
    kv.free(a)
    assert free_ids(kv) == [4, 3, 2, 1]
    # B = A's 12 tokens + 8: hit 12 ([1, 2, 3], all free) + 2 new = 5 > 4.
    b = req("b", [*toks(12), *toks(8, start=500)])
    hit, n = kv.get_computed_blocks(b)
    assert (hit.get_block_ids(), n) == (([1, 2, 3],), 12)
    assert kv.allocate_slots(b, 8, 12, hit) is None
    assert free_ids(kv) == [4, 3, 2, 1]
    assert ref_counts(kv) == [0] * 5
    assert kv.get_block_ids("b") == ([],)
    assert cached_ids(kv) == {1, 2, 3}
    kv.check_integrity()
    # With 4 extra tokens it fits exactly: 3 touched + 1 new.
    c = req("c", [*toks(12), *toks(4, start=500)])
    num_hit, new = admit(kv, c)
    assert (num_hit, new.get_block_ids()) == (12, ([4],))
    assert free_ids(kv) == []


def test_failed_decode_keeps_the_request_as_it_was() -> None:
    kv = manager(3, full(4))  # blocks 1, 2
    a = req("a", 8)
    admit(kv, a)
    assert decode(kv, a, 7) is None  # token 8 needs a third block
    assert a.num_computed_tokens == 8
    assert kv.get_block_ids("a") == ([1, 2],)
    assert ref_counts(kv) == [0, 1, 1] and free_ids(kv) == []
    kv.check_integrity()
    kv.free(a)
    assert free_ids(kv) == [2, 1]
    a.num_computed_tokens = 0  # restarted later: its 8 computed tokens hit
    assert hit_ids(kv, a) == ([1, 2],)


def test_reset_prefix_cache() -> None:
    kv = manager(10, full(4), enable_kv_cache_events=True, log_stats=True)
    a = req("a", 8)
    admit(kv, a)
    kv.take_events()
    assert kv.reset_prefix_cache() is False  # blocks 1 and 2 are in use
    assert cached_ids(kv) == {1, 2} and kv.take_events() == []
    stats = kv.make_prefix_cache_stats()
    assert stats is not None and stats.reset is False  # a failed reset is not counted
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert cached_ids(kv) == set()
    assert kv.take_events() == [AllBlocksCleared()]
    assert free_ids(kv) == [3, 4, 5, 6, 7, 8, 9, 2, 1]  # order kept, hashes gone
    assert hit_len(kv, req("b", 9)) == 0
    stats = kv.make_prefix_cache_stats()
    assert stats is not None and stats.reset is True
    kv.check_integrity()


def test_usage_counts_blocks_in_use_only() -> None:
    kv = manager(11, full(4))  # 10 usable blocks
    a, b = req("a", 10), req("b", toks(4, start=500))
    assert kv.usage == 0.0
    admit(kv, a)
    assert kv.usage == pytest.approx(0.3)
    admit(kv, b)
    assert kv.usage == pytest.approx(0.4)
    kv.free(a)  # cached free blocks count as free
    assert kv.usage == pytest.approx(0.1)
    kv.free(b)
    assert kv.usage == 0.0


def test_get_block_ids_and_free_of_unknown_requests() -> None:
    kv = manager(10, full(4))
    assert kv.get_block_ids("nobody") == ([],)
    assert kv.free("nobody") is False
    a = req("a", 5)
    assert kv.free(a) is False  # never allocated
    admit(kv, a)
    assert kv.free("a") is True  # by id
    assert kv.free(a) is False  # already freed
    assert kv.get_block_ids("a") == ([],)
    kv.check_integrity()


def test_prefix_cache_stats() -> None:
    assert manager(10, full(4)).make_prefix_cache_stats() is None  # log_stats off
    kv = manager(10, full(4), log_stats=True)
    a = req("a", 10)
    admit(kv, a)  # queries 10, hits 0
    b = req("b", [*toks(8), *toks(4, start=500)])
    assert admit(kv, b)[0] == 8  # queries 12, hits 8
    kv.free(b)
    # b is preempted and looked up again: counted apart.
    b.num_preemptions, b.num_computed_tokens = 1, 0
    assert hit_len(kv, b) == 8  # 12 tokens: at most 11 -> two blocks
    stats = kv.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (2, 22, 8)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 12, 8)
    assert stats.hit_rate == pytest.approx(8 / 22)
    assert stats.reset is False
    fresh = kv.make_prefix_cache_stats()  # reset after each call
    assert fresh is not None and (fresh.requests, fresh.queries, fresh.hits) == (0, 0, 0)
    assert fresh.preempted_requests == 0


def test_block_stored_and_removed_events() -> None:
    kv = manager(5, full(4), enable_kv_cache_events=True)  # blocks 1..4
    a = req("a", 10, lora_name="ad")
    admit(kv, a)
    h = a.block_hashes
    assert kv.take_events() == [
        BlockStored(
            block_hashes=[h[0], h[1]],
            parent_block_hash=None,
            token_ids=toks(8),
            block_size=4,
            lora_name="ad",
            group_id=0,
        )
    ]
    assert kv.take_events() == []  # drained
    decode(kv, a, 110)
    assert kv.take_events() == []  # block 3 not full yet
    decode(kv, a, 111)
    h = a.block_hashes
    assert kv.take_events() == [
        BlockStored([h[2]], h[1], [108, 109, 110, 111], 4, "ad", 0),
    ]
    kv.free(a)  # queue: [4, 3, 2, 1]
    admit(kv, req("b", toks(8, start=500)))  # pops 4 and 3: evicts A's block 2
    events = kv.take_events()
    assert events[0] == BlockRemoved([h[2]], 0)
    assert [type(e) for e in events] == [BlockRemoved, BlockStored]


def test_no_events_unless_enabled() -> None:
    kv: KVCacheManager = manager(4, full(4))
    a: Request = req("a", 8)
    admit(kv, a)
    kv.free(a)
    admit(kv, req("b", toks(12, start=500)))  # evicts both of A's blocks
    assert kv.reset_prefix_cache() is False
    assert kv.take_events() == []


def test_a_block_stored_in_a_later_step_names_its_parent() -> None:
    kv = manager(10, full(4), enable_kv_cache_events=True)
    a = req("a", 6)
    admit(kv, a)  # block 0 is full and stored; block 1 holds tokens 4-5
    (first,) = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert first.parent_block_hash is None and len(first.block_hashes) == 1
    decode(kv, a, 106)
    decode(kv, a, 107)  # block 1 is full now: stored, chained to block 0
    (second,) = [e for e in kv.take_events() if isinstance(e, BlockStored)]
    assert second.parent_block_hash == first.block_hashes[0]
    assert second.block_hashes == [a.block_hashes[1]] and second.token_ids == toks(8)[4:]
