"""Shedding under ``hybrid`` (``hybridkv.policy.shedding``), worked by hand
with exact block ids: when a running request's step does not fit, the newest
live request that retains blocks for kept points behind its window gives those
points up, if that alone makes room; otherwise the step fails (and a scheduler
preempts), with nothing changed. Admission never sheds.

Every case: full attention + a sliding window of 5 on blocks of 4, recency
only, no tail. A sliding query at ``n`` computed tokens reads blocks
``(n - 4) // 4`` on. ``a`` (tokens 0-3) and ``a2`` (50-53) are served and
freed first, so block 1 / 2 (full / sliding) hold a's prefix, 3 / 4 a2's.
"""

from __future__ import annotations

from factories import admit, config, decode, free_ids, full, hit_len, run_step, serve, swa

from hybridkv import KVCacheManager, Request


def manager(num_blocks: int) -> KVCacheManager:
    kv = KVCacheManager(
        config(num_blocks, full(4), swa(4, 5)),
        256,
        cache_policy="hybrid",
        hybrid_tail_tokens=0,
        hybrid_value_weight=0.0,
        hybrid_tail_align=0,
    )
    assert serve(kv, "a", list(range(4))) == 0
    assert serve(kv, "a2", list(range(50, 54))) == 0
    return kv


def retained(kv: KVCacheManager, rid: str) -> list[tuple[int, int]]:
    """``(table index, block id)`` the sliding group retains for ``rid``."""
    return [(i, b.block_id) for i, b in kv.coordinator.managers[1].states[rid].retained]


def kept(kv: KVCacheManager, rid: str) -> tuple[int, ...]:
    points = {m.states[rid].kept for m in kv.coordinator.managers}
    assert len(points) == 1, f"groups disagree on {rid}'s kept points: {points}"
    return points.pop()


def two_running(num_blocks: int, b2_prefix: list[int]) -> tuple[KVCacheManager, Request, Request]:
    """``b1`` (a's prefix + 16 tokens) then ``b2`` (``b2_prefix`` + 16) are
    admitted with a hit of 4 (kept points 4 and their prompt's end, 20) and
    decode 4 tokens: each retains its hit's sliding block 0 once its window
    passes it."""
    kv = manager(num_blocks)
    b1 = Request("b1", list(range(20)))
    b2 = Request("b2", [*b2_prefix, *range(200, 216)])
    assert admit(kv, b1)[0] == admit(kv, b2)[0] == 4
    for t in range(4):
        assert decode(kv, b1, 1000 + t) is not None
        assert decode(kv, b2, 1000 + t) is not None
    return kv, b1, b2


def test_a_request_sheds_its_own_kept_point_rather_than_fail() -> None:
    """``b`` (a's prefix + 16) is admitted with hit 4: kept points 4 and 20.
    Its first decode step moves its window past sliding block 0, which it
    retains (block 2) for point 4. ``c`` (12 tokens) then takes all but one
    free block (4, a2's sliding block). b's step to 25 tokens needs two blocks
    (full and sliding entry 6) and releases none: sliding entry 4 (block 12)
    is what point 20 needs, so it is retained. 2 > 1 free: b drops point 4
    (behind its window) and releases block 2 evict-first; the step takes it
    and 4. Point 20 stays, with block 12. A later request with a's prefix no
    longer hits: block 2 now holds b's full attention."""
    kv = manager(17)
    b = Request("b", list(range(20)))
    assert admit(kv, b)[0] == 4
    assert decode(kv, b, 999) is not None
    assert kv.get_block_ids("b") == ([1, 5, 6, 7, 8, 9], [0, 0, 0, 0, 12, 10])
    assert (retained(kv, "b"), kept(kv, "b")) == ([(0, 2)], (4, 20))
    assert hit_len(kv, Request("d", [*range(4), 77, 78])) == 4
    assert admit(kv, Request("c", list(range(100, 112))))[0] == 0
    assert free_ids(kv) == [4]
    for t in range(3):
        assert decode(kv, b, 1000 + t) == kv.empty_kv_cache_blocks()
    new = decode(kv, b, 5)
    assert new is not None and new.get_block_ids() == ([2], [4])
    assert kv.get_block_ids("b") == ([1, 5, 6, 7, 8, 9, 2], [0, 0, 0, 0, 0, 10, 4])
    assert (retained(kv, "b"), kept(kv, "b")) == ([(4, 12)], (20,))
    assert free_ids(kv) == []
    assert hit_len(kv, Request("d", [*range(4), 77, 78])) == 0
    kv.check_integrity()


def test_the_newest_request_that_retains_blocks_sheds() -> None:
    """``b1`` and ``b2`` (a2's prefix) each retain their hit's sliding block
    (2 and 4); ``c`` (12 tokens, no kept point behind it, newest) leaves one
    block free (25). b1's step needs two: b2, the newest that retains, drops
    its point 4 and releases block 4; b1 keeps its own."""
    kv, b1, _ = two_running(26, list(range(50, 54)))
    assert (retained(kv, "b1"), retained(kv, "b2")) == ([(0, 2)], [(0, 4)])
    assert admit(kv, Request("c", list(range(300, 312))))[0] == 0
    assert free_ids(kv) == [25]
    new = decode(kv, b1, 5)
    assert new is not None and new.get_block_ids() == ([4], [25])
    assert (retained(kv, "b1"), kept(kv, "b1")) == ([(0, 2), (4, 12)], (4, 20))
    assert (retained(kv, "b2"), kept(kv, "b2")) == ([], (20,))
    kv.check_integrity()


def test_only_one_request_sheds_and_a_failed_step_changes_nothing() -> None:
    """As above with one block fewer: none is free, b1's step needs two, b2
    can return one. b1's own retained block would make two, but only one
    request sheds per step: the step fails and every table, retained block
    and kept point is as it was. Preempting b2 (the scheduler's move) then
    makes room, and b1 still retains block 2 for its hit."""
    kv, b1, b2 = two_running(25, list(range(50, 54)))
    assert admit(kv, Request("c", list(range(300, 312))))[0] == 0
    assert free_ids(kv) == []
    before = (kv.get_block_ids("b1"), kv.get_block_ids("b2"))
    assert decode(kv, b1, 5) is None
    assert (kv.get_block_ids("b1"), kv.get_block_ids("b2")) == before
    assert (retained(kv, "b1"), kept(kv, "b1")) == ([(0, 2)], (4, 20))
    assert (retained(kv, "b2"), kept(kv, "b2")) == ([(0, 4)], (4, 20))
    kv.check_integrity()
    kv.free(b2)
    assert run_step(kv, b1, 1) is not None
    assert (retained(kv, "b1"), kept(kv, "b1")) == ([(0, 2), (4, 12)], (4, 20))
    kv.check_integrity()


def test_a_block_another_request_also_retains_is_not_shed() -> None:
    """b1 and b2 share a's prefix: both retain block 2 (ref count 2), so
    shedding either returns nothing, and the step fails."""
    kv, b1, _ = two_running(24, list(range(4)))
    assert (retained(kv, "b1"), retained(kv, "b2")) == ([(0, 2)], [(0, 2)])
    assert kv.block_pool.blocks[2].ref_cnt == 2
    assert admit(kv, Request("c", list(range(300, 312))))[0] == 0
    assert free_ids(kv) == [4]
    assert decode(kv, b1, 5) is None
    assert (kept(kv, "b1"), kept(kv, "b2")) == ((4, 20), (4, 20))
    kv.check_integrity()


def test_admission_never_sheds() -> None:
    """Five blocks free, b1 and b2 retain one each: ``c`` (12 tokens, six
    blocks) is not admitted, and nobody gives up a kept point for it."""
    kv, _, _ = two_running(24, list(range(50, 54)))
    assert len(free_ids(kv)) == 5
    c = Request("c", list(range(300, 312)))
    blocks, hit = kv.get_computed_blocks(c)
    assert hit == 0
    assert kv.allocate_slots(c, 12, hit, blocks) is None
    assert (retained(kv, "b1"), retained(kv, "b2")) == ([(0, 2)], [(0, 4)])
    assert (kept(kv, "b1"), kept(kv, "b2")) == ((4, 20), (4, 20))
    kv.check_integrity()
