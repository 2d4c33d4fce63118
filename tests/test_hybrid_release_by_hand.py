"""``cache_policy="hybrid"`` release, worked by hand with exact block ids: the end
point with two block sizes, blocks other requests hold, and sliding windows in
the tail. (tests/test_hybrid_policy.py has the single-block-size examples.)

Reading a queue: ``kv.block_pool.policy`` iterates in take order, so the head
is evicted first. Dead and hashless blocks go to the head; released units go
to the tail in release order (the first released is taken first among them).
"""

from __future__ import annotations

from factories import config, free_classes, full, swa

from hybridkv import KVCacheManager, Request


def manager(*specs, num_blocks=64, tail=0, weight=0.0) -> KVCacheManager:
    return KVCacheManager(
        config(num_blocks, *specs),
        256,
        cache_policy="hybrid",
        hybrid_tail_tokens=tail,
        hybrid_value_weight=weight,
    )


def admit(kv: KVCacheManager, rid: str, tokens: list[int]) -> tuple[Request, int]:
    """Admit with its prefix hit and compute the whole prompt; returns the hit."""
    req = Request(rid, tokens)
    blocks, hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, len(tokens) - hit, hit, blocks) is not None
    req.num_computed_tokens = len(tokens)
    return req, hit


def test_two_block_sizes_end_hashless_and_release_order() -> None:
    """Full attention on blocks of 4, a 12-token sliding window on blocks of 6:
    hits land on multiples of 12. A 22-token request holds full blocks 1-6 and
    sliding blocks 7-10; the last of each (6: tokens 20-21, 10: tokens 18-21)
    is partial, so it has no hash.

    It cached 20 full tokens and 18 sliding ones, so E = 12 (18 rounded down to
    the hit step; no hit can land on 18). Point 12 needs full blocks 1-3 and
    the window before 12, sliding blocks 7-8. Dead (cached, no point needs
    them): full 4, 5 and sliding 9, evicted first: [9, 5, 4]. The hashless
    blocks go before them: [10, 6]. Unit 12 is released deepest end first,
    groups in order: ends 12 (3, then 8), 8 (2), 6 (7), 4 (1).
    """
    kv = manager(full(4), swa(6, 12), num_blocks=24)
    req, hit = admit(kv, "a", list(range(22)))
    assert hit == 0
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10])
    kv.free(req)
    kv.check_integrity()
    queue = [b.block_id for b in kv.block_pool.policy]
    never_used = list(range(11, 24))
    assert queue == [10, 6, 9, 5, 4, *never_used, 3, 8, 2, 7, 1]


def test_blocks_another_request_holds_count_no_pages() -> None:
    """Weight 1, full attention + a sliding window of 8 (blocks of 4). ``a``
    computes 24 tokens (full 1-6, sliding 7-12); ``b`` shares its first 12 and
    holds full 1-3 and sliding 8-9 (the window before 12).

    Freeing ``a``: E = 24, the only point. It needs full 1-6 and sliding 11-12;
    sliding 7 and 10 are dead (no point needs them), and the blocks ``b`` holds
    stay in use. E's unit counts only the pages ``a`` gives back: full 4-6 and
    sliding 11-12, 24 tokens / 5 pages = 4.8, class 4 (counting ``b``'s three
    full blocks too would make it 24 / 8 = 3.0, class 3).
    """
    kv = manager(full(4), swa(4, 8), weight=1.0)
    a, _ = admit(kv, "a", list(range(24)))
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    _, hit = admit(kv, "b", [*range(12), 900, 901, 902, 903])
    assert hit == 12 and kv.get_block_ids("b") == ([1, 2, 3, 13], [0, 8, 9, 14])
    kv.free(a)
    kv.check_integrity()
    assert [x.block_id for x in kv.block_pool.policy][:2] == [10, 7]
    assert free_classes(kv) == {4: 4, 5: 4, 6: 4, 11: 4, 12: 4}
    assert all(kv.block_pool.blocks[i].ref_cnt == 1 for i in (1, 2, 3, 8, 9))


def test_sliding_tail_blocks_are_valued_as_the_end_unit() -> None:
    """Weight 1, full attention + two sliding groups (window 8, blocks of 4),
    tail 8, E = 24: tail points 16, 20 and 24 need sliding entries 2-3, 3-4 and
    4-5; entries 0-1 no point needs (dead, no class).

    Main point 24 holds the 6 full pages and both groups' entry 5: 24 / 8 = 3.0,
    class 3. Sliding windows of tail points nest (a lower point needs more of
    them), so entries 2-4 are valued as E's unit too: class 3. Valued by what
    their point saves, point 16's four blocks would be worth 8 tokens / 4 pages
    = 2.0, class 2.
    """
    kv = manager(full(4), swa(4, 8), swa(4, 8), tail=8, weight=1.0)
    req, _ = admit(kv, "a", list(range(24)))
    assert kv.get_block_ids("a") == (
        [1, 2, 3, 4, 5, 6],
        [7, 8, 9, 10, 11, 12],
        [13, 14, 15, 16, 17, 18],
    )
    kv.free(req)
    kv.check_integrity()
    assert {b.block_id for b in list(kv.block_pool.policy)[:4]} == {7, 8, 13, 14}
    expected = dict.fromkeys([1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 15, 16, 17, 18], 3)
    assert free_classes(kv) == expected


def test_the_end_is_rounded_down_to_the_hit_step_past_the_prompt() -> None:
    """As in the first example (full blocks of 4, a 12-token window on blocks
    of 6), but the prompt has 10 tokens and 12 more are decoded: the prompt
    point is 0, so ``E`` alone says where the request can be resumed. It
    cached 20 full and 18 sliding tokens: E = 12 (18 rounded down to the hit
    step), which needs full 1-3 and sliding 4-5. Dead: full 6, 8 and sliding
    7; hashless (partial): sliding 9 (tokens 18-21) and full 10 (20-21).
    Unrounded, E = 18 would keep full 6 and sliding 7.
    """
    kv = manager(full(4), swa(6, 12), num_blocks=24)
    req, hit = admit(kv, "a", list(range(10)))
    assert hit == 0
    for t in range(10, 22):
        req.append_output_token_ids(1000 + t)
        assert kv.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
    assert kv.get_block_ids("a") == ([1, 2, 3, 6, 8, 10], [4, 5, 7, 9])
    kv.free(req)
    kv.check_integrity()
    queue = [b.block_id for b in kv.block_pool.policy]
    assert queue == [9, 10, 7, 8, 6, *range(11, 24), 3, 5, 2, 4, 1]
