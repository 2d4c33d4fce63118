"""Hybrid models: sliding windows, chunked local attention, Mamba, mixed block sizes.

Block size 4 unless told. Sliding window W: the query at n reads from n-W+1,
so blocks wholly before that become null (0) and are released. Chunked C: the
query at n reads from (n//C)*C. Mamba: a hit of L needs the checkpoint at L.
"""

from __future__ import annotations

from factories import (
    admit,
    cached_ids,
    chunked,
    decode,
    free_ids,
    full,
    hit_ids,
    hit_len,
    mamba,
    manager,
    prefill,
    ref_counts,
    req,
    run_step,
    swa,
    toks,
)

from hybridkv import KVCacheManager


def _held(kv: KVCacheManager, rid: str) -> list[int]:
    """Non-null blocks per group."""
    return [sum(1 for b in t if b) for t in kv.get_block_ids(rid)]


# -- one full + two sliding groups ------------------------------------------------------
def test_full_and_two_sliding_groups_tables_over_time() -> None:
    # g0 full, g1 sliding W=5 (reads n-4..n), g2 sliding W=9 (reads n-8..n).
    kv = manager(30, full(4), swa(4, 5), swa(4, 9))
    a = req("a", 10)
    admit(kv, a)  # every group: 3 blocks, popped in group order
    assert kv.get_block_ids("a") == ([1, 2, 3], [4, 5, 6], [7, 8, 9])
    # n=10: g1 reads from 6 -> block 0 (tokens 0-3) is dropped; g2 reads from 2.
    decode(kv, a, 110)
    assert kv.get_block_ids("a") == ([1, 2, 3], [0, 5, 6], [7, 8, 9])
    assert free_ids(kv)[-1] == 4  # cached -> tail
    decode(kv, a, 111)  # n=11: nothing new is skipped; block 2 is now full
    assert kv.get_block_ids("a") == ([1, 2, 3], [0, 5, 6], [7, 8, 9])
    # n=12: g1 reads from 8 (drops block 1), g2 from 4 (drops block 0);
    # token 12 opens block 3 in each group: 10, 11, 12.
    new = decode(kv, a, 112)
    assert new is not None and new.get_block_ids() == ([10], [11], [12])
    assert kv.get_block_ids("a") == ([1, 2, 3, 10], [0, 0, 6, 11], [0, 8, 9, 12])
    assert free_ids(kv)[-3:] == [4, 5, 7]
    for tok in (113, 114, 115):
        decode(kv, a, tok)
    # n=16: g1 reads from 12, g2 from 8.
    decode(kv, a, 116)
    assert kv.get_block_ids("a") == (
        [1, 2, 3, 10, 13],
        [0, 0, 0, 11, 14],
        [0, 0, 9, 12, 15],
    )
    kv.check_integrity()

    # Free as vLLM does: each group's table in turn, last position first; hashless
    # (partial) blocks to the head, a later group's in front of an earlier one's.
    #   g0: 13 -> head; 10, 3, 2, 1 -> tail.  g1: 14 -> head; 11.  g2: 15 -> head; 12, 9
    kv.free(a)
    head, tail = [15, 14, 13], [4, 5, 7, 6, 8, 10, 3, 2, 1, 11, 12, 9]
    assert free_ids(kv) == [*head, *range(16, 30), *tail]

    # A's 17 tokens again: hit 16. g1 needs tokens 12-15, g2 tokens 8-15.
    assert hit_ids(kv, req("c", 17)) == ([1, 2, 3, 10], [0, 0, 0, 11], [0, 0, 9, 12])


def test_blocks_released_by_a_window_pay_for_other_groups() -> None:
    # Allocation counts the net need of all groups: here the sliding group's
    # released blocks fund the full group's new block.
    kv = manager(7, full(4), swa(4, 5))  # 6 usable blocks
    a = req("a", 12)
    prefill(kv, a)
    assert kv.get_block_ids("a") == ([1, 2, 3], [4, 5, 6]) and free_ids(kv) == []
    # Token 12 reads from 8 in g1: blocks 4, 5 go (tail first -> queue [5, 4]);
    # each group needs one new block: net 2 - 2 = 0. g0 pops 5, g1 pops 4.
    new = decode(kv, a, 112)
    assert new is not None and new.get_block_ids() == ([5], [4])
    assert kv.get_block_ids("a") == ([1, 2, 3, 5], [0, 0, 6, 4])
    kv.check_integrity()


def test_a_skipped_block_that_another_request_holds_frees_nothing() -> None:
    # W=5 (the query at n reads n-4..n); 3 usable blocks. A skipped block returns to
    # the free set only when no other request holds it: counting it as freed would
    # let the allocation go ahead and then run out of blocks half-way.
    kv = manager(4, swa(4, 5))
    a = req("a", 8)
    prefill(kv, a)
    assert kv.get_block_ids("a") == ([1, 2],) and free_ids(kv) == [3]
    # B repeats A's 8 tokens: its hit of 8 needs tokens 4-7 only, i.e. A's block 2.
    b = req("b", [*toks(8), 900])
    assert admit(kv, b)[0] == 8
    assert kv.get_block_ids("b") == ([0, 2, 3],) and free_ids(kv) == []
    # n=8: A drops block 1 (only A holds it) and takes it back for token 8: net 0.
    new = decode(kv, a, 108)
    assert new is not None and new.get_block_ids() == ([1],)
    for tok in (109, 110, 111):  # tokens 9-11 fit in A's block at position 2
        assert decode(kv, a, tok) is not None
    # (Block 0, the null block, is never ref counted.)
    assert kv.get_block_ids("a") == ([0, 2, 1],) and ref_counts(kv) == [0, 1, 2, 1]
    # n=12: A drops block 2, but B still holds it: net need 1 new block, 0 free.
    assert decode(kv, a, 112) is None
    assert kv.get_block_ids("a") == ([0, 2, 1],) and kv.get_block_ids("b") == ([0, 2, 3],)
    assert ref_counts(kv) == [0, 1, 2, 1] and free_ids(kv) == []
    kv.check_integrity()
    # Once B is gone, A's block 2 is freed (cached: to the tail) and B's 3 pays for it.
    kv.free(b)
    new = run_step(kv, a, 1)
    assert new is not None and new.get_block_ids() == ([3],)
    assert kv.get_block_ids("a") == ([0, 0, 1, 3],) and free_ids(kv) == [2]
    kv.check_integrity()


def test_long_decode_holds_about_window_over_block_size_plus_one() -> None:
    kv = manager(40, full(4), swa(4, 5), swa(4, 9))
    a = req("a", 10)
    admit(kv, a)
    for i in range(60):
        assert decode(kv, a, 500 + i) is not None
        n = a.num_computed_tokens  # tokens after this step
        g0, g1, g2 = _held(kv, "a")
        assert g0 == -(-n // 4)
        # The last query (n-1) reads from n-W: blocks (n-W)//4 .. (n-1)//4.
        assert g1 == (n - 1) // 4 - (n - 5) // 4 + 1 == 2  # W=5: 5/4 + 1
        assert g2 == (n - 1) // 4 - (n - 9) // 4 + 1 == 3  # W=9: 9/4 + 1
        kv.check_integrity()
    assert a.num_computed_tokens == 70


# -- sliding-window hits under several cached patterns ------------------------------------
def test_sliding_hits_shrink_as_the_tail_is_evicted() -> None:
    # W=6: a hit of L needs tokens L-5..L-1, i.e. blocks (L-5)//4 .. L/4-1.
    kv = manager(10, swa(4, 6))
    a = req("a", 21)
    admit(kv, a)  # [1..6], blocks 1-5 full and cached
    kv.free(a)
    assert free_ids(kv) == [6, 7, 8, 9, 5, 4, 3, 2, 1]
    c = req("c", 21)  # max 20 tokens
    assert hit_ids(kv, c) == ([0, 0, 0, 4, 5],)  # L=20 needs positions 3, 4
    admit(kv, req("x", toks(20, start=500)))  # pops 6, 7, 8, 9 and 5 (pos 4)
    assert hit_ids(kv, c) == ([0, 0, 3, 4],)  # L=16 needs positions 2, 3
    # Evict positions 3, 2, 1, 0 in turn (one block each):
    # L=12 needs 1-2, L=8 needs 0-1, L=4 needs 0, then nothing is left.
    expected: list[tuple[list[int]]] = [([0, 2, 3],), ([1, 2],), ([1],), ([],)]
    for i, want in enumerate(expected):
        admit(kv, req(f"y{i}", toks(3, start=600 + 10 * i)))
        assert hit_ids(kv, c) == want
    kv.check_integrity()


def test_sliding_hit_with_only_the_window_cached() -> None:
    kv = manager(8, swa(4, 6))
    a = req("a", 20)
    admit(kv, a)  # [1..5]
    decode(kv, a, 120)  # n=20 reads from 15: positions 0-2 (3, 2, 1) released
    assert kv.get_block_ids("a") == ([0, 0, 0, 4, 5, 6],)
    kv.free(a)  # 6 -> head; 5, 4 -> tail
    assert free_ids(kv) == [6, 7, 3, 2, 1, 5, 4]
    admit(kv, req("x", toks(20, start=500)))  # pops 6, 7, 3, 2, 1: A's prefix
    assert cached_ids(kv) - set(kv.get_block_ids("x")[0]) == {4, 5}
    # The prefix is gone but a sliding window does not need it.
    assert hit_ids(kv, req("c", 21)) == ([0, 0, 0, 4, 5],)


def test_the_null_block_is_never_ref_counted() -> None:
    # A sliding hit starts with null entries; adopting it must not count them
    # (a null ref count of 1 would pass for "freed by a skip" in the count of
    # net free blocks, and a full pool would then raise instead of saying None).
    kv = manager(8, swa(4, 6))
    a = req("a", 20)
    admit(kv, a)
    decode(kv, a, 120)
    kv.free(a)
    c = req("c", 21)
    assert hit_ids(kv, c) == ([0, 0, 0, 4, 5],)
    admit(kv, c)
    assert kv.get_block_ids("c")[0][:3] == [0, 0, 0]
    assert kv.block_pool.null_block.ref_cnt == 0
    kv.check_integrity()
    kv.free(c)
    assert kv.block_pool.null_block.ref_cnt == 0
    kv.check_integrity()


def test_hybrid_hit_is_the_fixed_point_of_all_groups() -> None:
    # g0 full, g1 sliding W=5 (a hit of L needs only block L/4 - 1).
    kv = manager(14, full(4), swa(4, 5))
    a = req("a", 20)
    admit(kv, a)
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    decode(kv, a, 120)  # g1 releases 9, 8, 7, 6; token 20 gets 11 and 12
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5, 11], [0, 0, 0, 0, 10, 12])
    kv.free(a)  # g0: 11 -> head, 5-1 -> tail; then g1: 12 -> head, 10 -> tail
    assert free_ids(kv) == [12, 11, 13, 9, 8, 7, 6, 5, 4, 3, 2, 1, 10]
    c = req("c", 21)
    assert hit_ids(kv, c) == ([1, 2, 3, 4, 5], [0, 0, 0, 0, 10])

    # X (16 tokens, 4 blocks per group) pops 12 11 13 9 | 8 7 6 5: the sliding
    # prefix and the full group's block 4 (5) go; sliding block 4 (10) stays.
    admit(kv, req("x", toks(16, start=500)))
    assert kv.get_block_ids("x") == ([12, 11, 13, 9], [8, 7, 6, 5])
    hashes = c.block_hashes
    full_m, swa_m = kv.coordinator.managers
    # Alone, the full group could hit 16 and the sliding group 20 ...
    assert [b.block_id for b in full_m.find_longest_cache_hit(hashes, 20)] == [1, 2, 3, 4]
    assert [b.block_id for b in swa_m.find_longest_cache_hit(hashes, 20)] == [0, 0, 0, 0, 10]
    # ... but no length is valid for both: at 16, 12, 8, 4 the sliding block is gone.
    assert hit_len(kv, c) == 0
    assert hit_ids(kv, c) == ([], [])
    kv.check_integrity()


# -- chunked local attention -------------------------------------------------------------
def test_chunked_frees_finished_chunks() -> None:
    kv = manager(10, chunked(4, 8))  # chunks [0-7] [8-15] [16-23]
    a = req("a", 10)
    prefill(kv, a)  # no lookup (see test_chunked_boundary_hit_needs_no_cache)
    assert kv.get_block_ids("a") == ([1, 2, 3],)
    decode(kv, a, 110)  # n=10 reads from 8: chunk 0 (blocks 1, 2) released
    assert kv.get_block_ids("a") == ([0, 0, 3],)
    assert free_ids(kv) == [4, 5, 6, 7, 8, 9, 2, 1]
    for tok in range(111, 116):
        decode(kv, a, tok)  # n=11..15: block 3 fills, token 12 opens block 4
    assert kv.get_block_ids("a") == ([0, 0, 3, 4],)
    decode(kv, a, 116)  # n=16 starts chunk 2: blocks 3 and 4 released
    assert kv.get_block_ids("a") == ([0, 0, 0, 0, 5],)
    assert free_ids(kv) == [6, 7, 8, 9, 2, 1, 4, 3]
    kv.check_integrity()


def test_chunked_boundary_hit_needs_no_cache() -> None:
    # Nothing is cached, yet a 10-token prompt hits 8: in a chunked-only model
    # tokens 8 and 9 never read chunk [0, 8), so it need not be computed.
    kv = manager(10, chunked(4, 8), log_stats=True)
    a = req("a", 10)
    num_hit, new = admit(kv, a)
    assert (num_hit, new.get_block_ids()) == (8, ([1],))
    assert kv.get_block_ids("a") == ([0, 0, 1],)
    stats = kv.make_prefix_cache_stats()
    assert stats is not None and (stats.queries, stats.hits) == (10, 8)
    # Two full chunks, nothing cached: the hit stops at the last boundary, 16.
    assert hit_ids(kv, req("b", toks(20, start=900))) == ([0, 0, 0, 0],)
    # Short of a boundary there is nothing to skip.
    assert hit_len(kv, req("c", toks(8, start=900))) == 0
    kv.check_integrity()


def test_chunked_hits() -> None:
    kv = manager(10, chunked(4, 8))
    a = req("a", 16)
    prefill(kv, a)  # [1, 2, 3, 4], all cached
    kv.free(a)
    assert free_ids(kv) == [5, 6, 7, 8, 9, 4, 3, 2, 1]
    # L=12 is inside chunk [8, 16): it needs block 2 (tokens 8-11) only.
    assert hit_ids(kv, req("c", 13)) == ([0, 0, 3],)
    # A hit ending at a chunk boundary needs nothing: tokens 0-7 are never read.
    assert hit_ids(kv, req("d", toks(9, start=900))) == ([0, 0],)
    prefill(kv, req("x", toks(24, start=500)))  # pops 5..9 and 4: A's last block
    assert hit_ids(kv, req("e", 16)) == ([0, 0, 3],)  # L=12 still valid
    admit(kv, req("y", toks(1, start=700)))  # pops 3
    assert hit_ids(kv, req("e2", 16)) == ([0, 0],)  # back to the boundary
    # With a full-attention group, the boundary hit needs the full prefix.
    hybrid = manager(10, full(4), chunked(4, 8))
    assert hit_len(hybrid, req("f", toks(9, start=900))) == 0


# -- Mamba ---------------------------------------------------------------------------------
def test_mamba_running_state_and_checkpoint_hits() -> None:
    kv = manager(10, mamba(4))
    a = req("a", 10)
    admit(kv, a)  # checkpoints after tokens 4 and 8 (blocks 1, 2), running state 3
    assert kv.get_block_ids("a") == ([1, 2, 3],) and cached_ids(kv) == {1, 2}
    decode(kv, a, 110)  # n=10 reads entry (10-1)//4 = 2: entries 0, 1 released
    assert kv.get_block_ids("a") == ([0, 0, 3],)
    decode(kv, a, 111)  # 12 tokens: block 3 is the checkpoint at 12
    assert cached_ids(kv) == {1, 2, 3}
    decode(kv, a, 112)  # crossing a boundary: two blocks for one step
    assert kv.get_block_ids("a") == ([0, 0, 3, 4],)
    decode(kv, a, 113)  # back to one block
    assert kv.get_block_ids("a") == ([0, 0, 0, 4],)
    assert free_ids(kv) == [5, 6, 7, 8, 9, 2, 1, 3]

    # A hit of L needs exactly the checkpoint at L.
    assert hit_ids(kv, req("c12", 13)) == ([0, 0, 3],)
    assert hit_ids(kv, req("c8", 12)) == ([0, 2],)  # at most 11 tokens -> L=8
    diverge = req("d", [*toks(10), 7, 7, 7, 7])  # checkpoint 12 differs
    assert hit_ids(kv, diverge) == ([0, 2],)
    admit(kv, req("x", toks(21, start=500)))  # 6 blocks: 5..9 and 2 (ckpt 8)
    assert hit_ids(kv, req("c8b", 12)) == ([1],)  # falls back to the checkpoint at 4
    # Adopting a checkpoint: it is read, the new state goes to a fresh block.
    c = req("c", 13)
    num_hit, new = admit(kv, c)
    assert (num_hit, new.get_block_ids()) == (12, ([1],))
    assert kv.get_block_ids("c") == ([0, 0, 3, 1],)
    kv.check_integrity()


def test_mamba_without_caching_keeps_one_block() -> None:
    kv = manager(10, mamba(4), enable_caching=False)
    one_shot = req("o", 10)
    admit(kv, one_shot)
    assert kv.get_block_ids("o") == ([0, 0, 1],)  # no checkpoints: null entries
    kv.free(one_shot)
    # Chunked prefill 4 + 4 + 2.
    a = req("a", 10)
    run_step(kv, a, 4)
    assert kv.get_block_ids("a") == ([1],)
    run_step(kv, a, 4)  # reads entry 0, writes entry 1
    assert kv.get_block_ids("a") == ([1, 2],)
    run_step(kv, a, 2)  # entry 0 released (hashless -> head) and reused at once
    assert kv.get_block_ids("a") == ([0, 2, 1],)
    decode(kv, a, 110)
    assert kv.get_block_ids("a") == ([0, 0, 1],)
    assert free_ids(kv) == [2, 3, 4, 5, 6, 7, 8, 9]
    kv.check_integrity()


def test_mamba_without_caching_at_a_full_pool() -> None:
    # Block size 2, 2 usable blocks, prefix caching off: A (3 tokens) holds only its
    # last entry, B (1 token) the other block. A step inside A's last block needs
    # no block even with none free; crossing into the next one needs one.
    kv = manager(3, mamba(2), enable_caching=False)
    a = req("a", 3)
    prefill(kv, a)
    prefill(kv, req("b", toks(1, 300)))
    assert kv.get_block_ids("a") == ([0, 1],) and free_ids(kv) == []
    new = decode(kv, a, 103)  # token 3: still block 1
    assert new is not None and new.get_block_ids() == ([],)
    assert decode(kv, a, 104) is None  # token 4 opens entry 2: no block free
    assert kv.get_block_ids("a") == ([0, 1],)
    kv.check_integrity()


def test_full_and_mamba_hit_only_at_shared_checkpoints() -> None:
    kv = manager(10, full(4), mamba(4))
    a = req("a", 14)
    admit(kv, a)
    assert kv.get_block_ids("a") == ([1, 2, 3, 4], [5, 6, 7, 8])
    assert hit_ids(kv, req("c", 14)) == ([1, 2, 3], [0, 0, 7])
    decode(kv, a, 114)  # Mamba releases its checkpoints 7, 6, 5
    assert free_ids(kv) == [9, 7, 6, 5]
    admit(kv, req("x", toks(3, start=500)))  # pops 9 and 7 (checkpoint at 12)
    # Full could give 12; Mamba's newest checkpoint <= 12 is at 8.
    assert hit_ids(kv, req("c2", 14)) == ([1, 2], [0, 6])
    kv.check_integrity()


# -- different block sizes ----------------------------------------------------------------
def test_mixed_block_sizes_hit_multiples_of_both() -> None:
    # g0 sliding bs 2, W=3 (a hit of L needs tokens L-2, L-1); g1 full bs 4.
    kv = manager(20, swa(2, 3), full(4))
    a = req("a", 12)
    admit(kv, a)
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [7, 8, 9])
    kv.free(a)
    # Released as vLLM does: each group's table in turn, last block first.
    assert free_ids(kv) == [*range(10, 20), 6, 5, 4, 3, 2, 1, 9, 8, 7]
    d = req("d", 13)
    assert hit_ids(kv, d) == ([0, 0, 0, 0, 0, 6], [7, 8, 9])
    # X (14 tokens: 7 + 4 blocks) pops 10..19 and 6: sliding block 5 is gone.
    admit(kv, req("x", toks(14, start=500)))
    # Sliding alone would stop at 10; 10 is no multiple of 4 -> full gives 8,
    # and at 8 the sliding group needs block 3 (tokens 6-7): hit 8.
    assert hit_ids(kv, d) == ([0, 0, 0, 4], [7, 8])
    kv.check_integrity()
