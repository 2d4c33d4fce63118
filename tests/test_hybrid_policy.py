"""``cache_policy="hybrid"``: worked examples with exact block ids.

Config: block size 4; group 0 full attention, group 1 sliding window 8 (a hit
at ``L`` needs blocks ``(L - 7) // 4 .. L // 4 - 1``), chunked attention with
chunk 8 (blocks ``L // 8 * 2 .. L // 4 - 1``) or Mamba (a hit at ``L`` needs
the state at ``L``, entry ``L // 4 - 1``). No tail
(``hybrid_tail_tokens=0``) unless stated.
"""

from __future__ import annotations

import random

import pytest
from factories import chunked, config, full, hit_len, mamba, swa

from hybridkv import (
    KVCacheManager,
    Request,
)

FULL, SWA, CHUNKED, MAMBA = full(4), swa(4, 8), chunked(4, 8), mamba(4)


def manager(
    *specs, num_blocks=64, tail=0, policy="hybrid", weight=0.0, bonus=0.0
) -> KVCacheManager:
    """Recency only (``weight`` 0) and no return bonus unless stated: these
    examples check the kept points and release order; tests/test_cost_aware.py
    checks the ranking, tests/test_returning.py the bonus."""
    return KVCacheManager(
        config(num_blocks, *specs),
        256,
        cache_policy=policy,
        hybrid_tail_tokens=tail,
        hybrid_value_weight=weight,
        hybrid_return_bonus=bonus,
    )


def run(kv: KVCacheManager, rid: str, tokens: list[int], chunk: int = 1000) -> int:
    """Admit, prefill in chunks, free; return the hit."""
    req = Request(rid, tokens)
    blocks, hit = kv.get_computed_blocks(req)
    req.num_computed_tokens = 0
    n = min(len(tokens) - hit, chunk)
    assert kv.allocate_slots(req, n, hit, blocks) is not None
    req.num_computed_tokens = hit + n
    while req.num_computed_tokens < len(tokens):
        n = min(len(tokens) - req.num_computed_tokens, chunk)
        assert kv.allocate_slots(req, n) is not None
        req.num_computed_tokens += n
    kv.check_integrity()
    kv.free(req)
    kv.check_integrity()
    return hit


def test_sliding_blocks_no_kept_point_needs_go_to_the_head() -> None:
    kv = manager(FULL, SWA)
    req = Request("a", list(range(24)))
    blocks, hit = kv.get_computed_blocks(req)
    got = [kv.allocate_slots(req, 8, hit, blocks).get_block_ids()]
    for _ in range(2):
        req.num_computed_tokens += 8
        got.append(kv.allocate_slots(req, 8).get_block_ids())
    # At 16 computed tokens the window starts at block (16 - 8 + 1) // 4 = 2: sliding
    # blocks 3, 4 are needed by no kept point, go to the head and are reused at once.
    assert got == [([1, 2], [3, 4]), ([5, 6], [7, 8]), ([3, 4], [9, 10])]
    req.num_computed_tokens = 24
    kv.free(req)
    queue = [b.block_id for b in kv.block_pool.policy]
    # E = 24 needs sliding blocks 4, 5 (ids 9, 10); ids 7, 8 (positions 2, 3) are dead:
    # head, tail first. The unit of 24 goes to the tail, deepest position first.
    assert queue[:2] == [8, 7]
    assert queue[-8:] == [4, 10, 3, 9, 6, 5, 2, 1]
    assert all(kv.block_pool.blocks[b].block_hash is not None for b in queue[:2])
    assert run(kv, "b", [*list(range(24)), 99]) == 24


def test_branch_point_is_kept_and_hit_later() -> None:
    kv = manager(FULL, SWA, num_blocks=40)
    a = list(range(32))
    run(kv, "a", a)  # kept: 32
    # b shares 16 tokens: full matches 16, the window of 16 was released dead but
    # is still cached (no pressure): hit 16, branch point = hit.
    b = a[:16] + list(range(100, 116))
    assert run(kv, "b", b) == 16
    # Fill the pool so that dead blocks are evicted.
    for k in range(3):
        run(kv, f"f{k}", list(range(1000 + 100 * k, 1000 + 100 * k + 24)))
    c = a[:16] + list(range(200, 216))
    assert run(kv, "c", c) == 16  # b kept 16 as its admission hit


def test_mamba_states_only_at_kept_points() -> None:
    kv = manager(FULL, MAMBA)
    req = Request("a", list(range(30)))
    blocks, hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, 30, hit, blocks) is not None
    mamba_table = kv.get_block_ids("a")[1]
    # 8 entries; real: the running state (7) and the last boundary (28 -> entry 6).
    assert [i for i, b in enumerate(mamba_table) if b] == [6, 7]
    kv.free(req)
    lru = manager(FULL, MAMBA, policy="lru")
    req = Request("a", list(range(30)))
    blocks, hit = lru.get_computed_blocks(req)
    lru.allocate_slots(req, 30, hit, blocks)
    assert all(lru.get_block_ids("a")[1])  # lru: a state at every boundary


def test_mamba_branch_point_gets_a_state() -> None:
    kv = manager(FULL, MAMBA)
    run(kv, "a", list(range(30)))  # states kept at 28 only
    b = list(range(20)) + list(range(500, 510))  # full matches 20; no state at 20
    req = Request("b", b)
    blocks, hit = kv.get_computed_blocks(req)
    assert hit == 0 and blocks.full_hit_tokens == 20
    assert kv.allocate_slots(req, len(b), hit, blocks) is not None
    table = kv.get_block_ids("b")[1]
    assert [i for i, x in enumerate(table) if x] == [4, 6, 7]  # 20 -> entry 4; 28; running
    req.num_computed_tokens = len(b)
    kv.free(req)
    c = list(range(20)) + list(range(700, 710))
    assert run(kv, "c", c) == 20


def test_full_hit_tokens_is_where_every_full_group_matches() -> None:
    """The branch point is how far the full-attention groups *together* match:
    with group 1's third block out of the cache, groups 0 and 1 share 8 tokens
    (group 0 alone would match 16)."""
    kv = manager(FULL, FULL, MAMBA)
    run(kv, "a", list(range(20)))
    holder = Request("b", list(range(21)))  # hits a's 20 tokens: holds a's blocks
    blocks, hit = kv.get_computed_blocks(holder)
    assert hit == 20 and kv.allocate_slots(holder, 1, hit, blocks) is not None
    third = kv.coordinator.get_blocks("b")[1][2]
    assert third is blocks.blocks[1][2]
    kv.block_pool.uncache(third)
    c = Request("c", [*range(16), *range(900, 908)])
    blocks, hit = kv.get_computed_blocks(c)
    assert [len(g) for g in blocks.blocks[:2]] == [hit // 4, hit // 4]
    assert blocks.full_hit_tokens == 8
    kv.check_integrity()


def test_full_hit_tokens_is_the_hit_without_a_full_group() -> None:
    """No full-attention group: the branch point is the hit itself, not a
    sliding group's longer match (here 16, while Mamba has no state there)."""
    kv = manager(SWA, MAMBA)
    run(kv, "a", list(range(20)))  # Mamba states at 20 (the end) only
    c = Request("c", [*range(18), *range(900, 906)])
    blocks, hit = kv.get_computed_blocks(c)
    assert hit == 0 and blocks.full_hit_tokens == 0


def test_tail_keeps_hit_points_before_the_end() -> None:
    kv = manager(FULL, MAMBA, tail=8)
    run(kv, "a", list(range(30)))  # states at 20, 24, 28 (the last 8 tokens' boundaries)
    for n in (20, 24, 28):
        assert run(kv, f"b{n}", [*list(range(n)), 900 + n, 901 + n]) == n


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("specs", [(FULL,), (FULL, full(8))], ids=["one", "two-block-sizes"])
def test_one_full_group_makes_the_same_decisions(seed: int, specs) -> None:
    """No regression: without skipping groups both policies are identical (also
    with full-attention groups of two block sizes, vLLM's unification of two
    head sizes: a block past the last common boundary is not dead to ``lru``)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 40))] for _ in range(4)]
    runs = []
    for policy in ("lru", "hybrid"):
        kv = manager(*specs, num_blocks=24 * len(specs), policy=policy)
        r2 = random.Random(seed)
        trace = []
        for k in range(60):
            p = prefixes[r2.randrange(4)] + [r2.randrange(50) for _ in range(r2.randrange(1, 12))]
            req = Request(f"r{k}", p)
            blocks, hit = kv.get_computed_blocks(req)
            out = kv.allocate_slots(req, len(p) - hit, hit, blocks)
            trace.append((hit, kv.get_block_ids(req.request_id), out is None))
            kv.free(req)
            trace.append(tuple(b.block_id for b in kv.block_pool.policy))
        runs.append(trace)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("second", [SWA, CHUNKED, MAMBA], ids=["sliding", "chunked", "mamba"])
def test_without_prefix_caching_hybrid_is_lru(second) -> None:
    """Nothing is cached, so there is nothing to keep: ``hybrid`` must release a
    sliding window's passed blocks as ``lru`` does, and take the same blocks."""
    runs = []
    for policy in ("lru", "hybrid"):
        kv = KVCacheManager(
            config(40, FULL, second), 256, cache_policy=policy, enable_caching=False
        )
        trace = []
        reqs = [Request(f"r{k}", list(range(k, k + 10 + 3 * k))) for k in range(3)]
        for _ in range(12):  # prefill, then decode: the window passes blocks
            for r in reqs:
                n = r.num_tokens - r.num_computed_tokens
                trace.append((kv.allocate_slots(r, n) is None, kv.get_block_ids(r.request_id)))
                r.num_computed_tokens += n
                r.append_output_token_ids(7)
            trace.append(kv.block_pool.num_free_blocks)
        for r in reqs:
            kv.free(r)
        kv.check_integrity()
        runs.append(trace)
    assert runs[0] == runs[1]


def test_tail_points_release_unit_by_unit() -> None:
    """Tail 8 at E = 24: kept points 16, 20, 24. Sliding blocks 0, 1 are needed by
    none (head); block 2 and 3 by 16, 4 by 20, 5 by 24; full blocks 0-3 by 16."""
    kv = manager(FULL, SWA, tail=8)
    req = Request("a", list(range(24)))
    blocks, hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, 24, hit, blocks).get_block_ids() == (
        [1, 2, 3, 4, 5, 6],
        [7, 8, 9, 10, 11, 12],
    )
    req.num_computed_tokens = 24
    kv.free(req)
    queue = [b.block_id for b in kv.block_pool.policy]
    assert queue[:2] == [8, 7]
    assert queue[-10:] == [6, 12, 5, 11, 4, 10, 3, 9, 2, 1]


@pytest.mark.parametrize(
    ("policy", "b_blocks", "hit"),
    [("hybrid", ([12, 11, 10], [9, 8, 7]), 24), ("lru", ([6, 5, 4], [3, 2, 1]), 0)],
)
def test_under_pressure_dead_blocks_go_before_kept_ones(
    policy: str, b_blocks: tuple[list[int], list[int]], hit: int
) -> None:
    """Full attention and chunked attention (chunk 8: a hit at ``L`` needs chunked
    blocks ``L // 8 * 2 .. L // 4 - 1``), 12 blocks, all used by ``a`` (24 tokens).

    Once ``a`` is freed every free block is cached. Chunked blocks 1, 3, 5 (ids 8,
    10, 12) are dead: no hit needs the last block of a chunk (a hit at the chunk's
    end needs nothing before it). Blocks 0, 2, 4 (ids 7, 9, 11) serve hits at 4,
    12, 20, which no kept point is. The kept point ``E = 24`` needs full blocks
    1-6 only. ``b`` needs 6 blocks: ``hybrid`` evicts the 6 chunked ones and the
    hit at 24 survives; ``lru`` released ``a``'s tables as vLLM does (the full one,
    then the chunked one, each tail first), so it evicts every full block: no hit.
    """
    kv = manager(FULL, CHUNKED, num_blocks=13, policy=policy)
    a = Request("a", list(range(24)))
    blocks, n = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 24, n, blocks).get_block_ids() == (
        [1, 2, 3, 4, 5, 6],
        [7, 8, 9, 10, 11, 12],
    )
    a.num_computed_tokens = 24
    kv.free(a)
    pool = kv.block_pool
    assert pool.num_free_blocks == 12
    assert all(b.block_hash is not None for b in pool.policy)  # no uncached free block
    b = Request("b", list(range(100, 112)))
    blocks, n = kv.get_computed_blocks(b)
    assert n == 0
    assert kv.allocate_slots(b, 12, n, blocks).get_block_ids() == b_blocks
    b.num_computed_tokens = 12
    kv.free(b)
    assert hit_len(kv, Request("c", [*range(24), 99])) == hit


def test_freed_units_are_valued_by_hand() -> None:
    """Weight 1, FULL + SWA (window 8, block 4), tail 0: exact value classes and keys.

    A (32 tokens) keeps only E = 32: full blocks 0-7 and sliding blocks 6, 7
    (the window of 32) are 10 pages saving 32 tokens: 3.2 per page, class
    floor(2 log2 3.2) = 3; sliding blocks 0-5 are dead (the head, no class).
    B = A's 32 tokens + 4 hits 32 and keeps H = 32 and E = 36. Unit 36 holds
    B's new full block and its sliding block 8 (7 is unit 32's): 4 tokens over
    2 pages = 2.0, capped by the shallower 3.2: class 2. Unit 32 is A's again:
    class 3. Release: unit 36 first, then unit 32 deepest first; each keyed
    block's key is clock / 63 + weight * class / 2 (63 usable blocks).
    """
    kv = manager(FULL, SWA, weight=1.0)
    pol = kv.block_pool.policy
    run(kv, "a", list(range(32)))
    a_units = [8, 16, 7, 15, 6, 5, 4, 3, 2, 1]  # full ids 1-8, sliding ids 15, 16
    assert [b.block_id for b in pol][:6] == [14, 13, 12, 11, 10, 9]  # dead sliding
    keyed = [(b.block_id, b.free_class, b.evict_key) for b in pol if b.free_class is not None]
    assert keyed == [(i, 3, pytest.approx(k / 63 + 1.5)) for k, i in enumerate(a_units, 1)]
    assert run(kv, "b", [*range(32), *range(100, 104)]) == 32
    keyed = [(b.block_id, b.free_class, b.evict_key) for b in pol if b.free_class is not None]
    b_units = [(14, 2), (13, 2)] + [(i, 3) for i in a_units]
    assert keyed == [
        (i, cls, pytest.approx(clock / 63 + cls / 2))
        for clock, (i, cls) in enumerate(b_units, len(a_units) + 1)
    ]


def test_tail_states_are_valued_by_what_they_save_by_hand() -> None:
    """Weight 1, FULL + two Mamba groups (block 4), tail 8, E = 24: tail points
    16, 20, 24 each get a state per Mamba group (table entries 3, 4, 5).

    E's unit (full block 5, both entry-5 states) and every full block belong to
    main point 24: 24 tokens over 6 full + 2 state pages = 3.0, class 3. A tail
    point's own states are worth what dropping them loses over their 2 pages,
    capped at 3.0: point 20 loses 4 tokens (a hit falls to 16): 2.0, class 2;
    point 16 loses 8 (to 8): 4.0, capped: class 3. Release: unit 24, 20, 16,
    each deepest position first, groups in order; key = clock / 63 + class / 2.
    """
    kv = manager(FULL, MAMBA, MAMBA, tail=8, weight=1.0)
    req = Request("a", list(range(24)))
    blocks, hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, 24, hit, blocks).get_block_ids() == (
        [1, 2, 3, 4, 5, 6],
        [7, 8, 9],  # entries 3, 4, 5 (the others stay null)
        [10, 11, 12],
    )
    req.num_computed_tokens = 24
    kv.free(req)
    order = [(6, 3), (9, 3), (12, 3), (5, 3), (8, 2), (11, 2), (4, 3), (7, 3), (10, 3)]
    order += [(3, 3), (2, 3), (1, 3)]
    keys = {i: pytest.approx(clock / 63 + cls / 2) for clock, (i, cls) in enumerate(order, 1)}
    pol = kv.block_pool.policy
    got = {b.block_id: (b.free_class, b.evict_key) for b in pol if b.free_class is not None}
    assert got == {i: (cls, keys[i]) for i, cls in order}


def test_the_tail_rounds_down_to_the_hit_step() -> None:
    """hybrid_tail_tokens=10 on blocks of 4 is a tail of 8 (points 16, 20, 24 at
    E = 24), not 12 (which would keep 12 too)."""

    def queue_after_free(tail: int) -> list[int]:
        kv = manager(FULL, SWA, tail=tail)
        req = Request("a", list(range(24)))
        blocks, hit = kv.get_computed_blocks(req)
        assert kv.allocate_slots(req, 24, hit, blocks) is not None
        req.num_computed_tokens = 24
        kv.free(req)
        return [b.block_id for b in kv.block_pool.policy]

    assert queue_after_free(10) == queue_after_free(8) != queue_after_free(12)
