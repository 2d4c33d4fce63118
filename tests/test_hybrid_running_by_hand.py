"""``cache_policy="hybrid"`` while a request runs, worked by hand with exact block
ids: which kept points it is admitted with (its hit, its branch point aligned
to the hit step and below its last token), and what it holds for them and for
its tail as its window moves on. (tests/test_hybrid_release_by_hand.py has
the release at ``free``; tests/test_hybrid_policy.py the hits that follow.)

A sliding window of ``W`` on blocks of ``bs`` reads, at ``n`` computed tokens,
blocks ``(n - W + 1) // bs`` on; a Mamba group on blocks of ``bs`` reads only
entry ``(n - 1) // bs`` (the state after the block before ``n``).
"""

from __future__ import annotations

import pytest
from factories import admit, config, decode, free_ids, full, mamba, serve, swa

from hybridkv import KVCacheManager, Request


def manager(*specs, num_blocks=64, tail=0) -> KVCacheManager:
    """Recency only, no tail unless stated, alignment fixed dense."""
    return KVCacheManager(
        config(num_blocks, *specs),
        256,
        cache_policy="hybrid",
        hybrid_tail_tokens=tail,
        hybrid_value_weight=0.0,
        hybrid_tail_align=0,
    )


def real(table: list[int]) -> list[int]:
    """Entries of a Mamba table that hold a state (not the null block)."""
    return [i for i, b in enumerate(table) if b]


@pytest.mark.parametrize("bs", [4, 1])
def test_a_running_request_holds_the_window_its_admission_hit_needs(bs: int) -> None:
    """Full attention + a sliding window of ``bs + 1`` (blocks of ``bs``). ``a``
    computes one block (full 1, sliding 2) and is freed; ``b`` (five blocks)
    hits it: kept point ``bs`` (also at ``bs = 1``: a hit of one token), whose
    window is sliding block 0, a's block 2.

    b's first decode step reads from block 4: the window passes blocks 0-3.
    Block 2 is held for the kept point (out of the table, ref count 1); b's
    own 7, 8 and 9 go to the head of the free queue (nothing needs them), where
    the step takes its new blocks: 7 (full), 8 (sliding). 9 stays first.
    """
    kv = manager(full(bs), swa(bs, bs + 1), num_blocks=16)
    assert serve(kv, "a", list(range(bs))) == 0
    b = Request("b", list(range(5 * bs)))
    assert admit(kv, b)[0] == bs
    assert kv.get_block_ids("b") == ([1, 3, 4, 5, 6], [2, 7, 8, 9, 10])
    assert decode(kv, b, 999) is not None
    assert kv.get_block_ids("b") == ([1, 3, 4, 5, 6, 7], [0, 0, 0, 0, 10, 8])
    assert kv.block_pool.blocks[2].ref_cnt == 1  # held for kept point bs
    assert free_ids(kv) == [9, 11, 12, 13, 14, 15]
    kv.check_integrity()


def test_a_running_request_holds_the_blocks_of_its_tail() -> None:
    """Tail 8: a running request keeps whole the hit points of its last 8
    tokens (here 16 at 24 computed), so its window is released only up to
    where point 16's starts: (16 - 7) // 4 = block 2. Without the tail it
    would release up to the window of 24, block 4. The released 7 and 8 are
    taken at once by the decode step."""
    kv = manager(full(4), swa(4, 8), tail=8)
    r = Request("r", list(range(24)))
    assert admit(kv, r)[0] == 0
    assert kv.get_block_ids("r") == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    assert decode(kv, r, 999) is not None
    assert kv.get_block_ids("r") == ([1, 2, 3, 4, 5, 6, 7], [0, 0, 9, 10, 11, 12, 8])
    kv.check_integrity()


def test_with_a_hit_step_of_one_the_first_token_is_already_a_boundary() -> None:
    """Blocks of one token and a sliding window of 1: the query at ``n`` reads
    only token ``n``. With one token computed, hits may land on 1, so the
    request holds nothing for an earlier point: sliding block 2 (token 0) is
    released at once, and the next step takes it for full attention."""
    kv = manager(full(1), swa(1, 1))
    r = Request("r", list(range(3)))
    assert kv.allocate_slots(r, 1) is not None
    assert kv.get_block_ids("r") == ([1], [2])
    r.num_computed_tokens = 1
    assert kv.allocate_slots(r, 1) is not None
    assert kv.get_block_ids("r") == ([1, 2], [0, 3])
    kv.check_integrity()


def test_the_branch_point_is_aligned_down_to_the_hit_step() -> None:
    """Full attention on blocks of 4, Mamba on blocks of 8: hits land on
    multiples of 8. ``a`` (16 tokens) leaves a state at 16 only; ``b`` shares
    its first 12 tokens: full attention matches 12, no state below, hit 0.
    b's branch point is 8 (12 aligned down), whose hit needs Mamba entry 0.

    So b gives entry 0 a state (block 14), and holds it when its decode step
    at 32 releases entries 0-2: the step takes its new blocks (16, 17) from
    the free queue, not 14. (12 is no hit boundary: a kept point there would
    hold no Mamba state.)"""
    kv = manager(full(4), mamba(8))
    assert serve(kv, "a", list(range(16))) == 0
    b = Request("b", [*range(12), *range(500, 520)])
    blocks, hit = kv.get_computed_blocks(b)
    assert (hit, blocks.full_hit_tokens) == (0, 12)
    assert kv.allocate_slots(b, 32, hit, blocks) is not None
    b.num_computed_tokens = 32
    # entry 0: branch point 8; entry 3: the end, 32
    assert kv.get_block_ids("b") == ([6, 7, 8, 9, 10, 11, 12, 13], [14, 0, 0, 15])
    assert decode(kv, b, 999) is not None
    assert kv.get_block_ids("b") == ([6, 7, 8, 9, 10, 11, 12, 13, 16], [0, 0, 0, 15, 17])
    assert kv.block_pool.blocks[14].ref_cnt == 1  # held for point 8
    kv.check_integrity()


def test_a_branch_point_just_before_the_last_token_is_kept() -> None:
    """Full attention + Mamba, blocks of 4. ``a`` (24 tokens) leaves a Mamba
    state at 24 only. ``b`` repeats a's first 20 tokens and adds one: full
    attention matches 20 (a hit never covers the last token), no state at 20
    or below: hit 0, branch point 20, the last boundary before b's last token.
    b keeps a state there (entry 4), besides its running state (entry 5)."""
    kv = manager(full(4), mamba(4))
    assert serve(kv, "a", list(range(24))) == 0
    b = Request("b", [*range(20), 999])
    blocks, hit = kv.get_computed_blocks(b)
    assert (hit, blocks.full_hit_tokens) == (0, 20)
    assert kv.allocate_slots(b, 21, hit, blocks) is not None
    assert real(kv.get_block_ids("b")[1]) == [4, 5]
    kv.check_integrity()


def test_a_hit_found_for_a_longer_request_keeps_the_same_points() -> None:
    """``c`` (a's first 20 tokens and one more) matches 20 tokens in full
    attention, hit 0. ``b``, a's first 20 tokens alone, adopting c's (empty)
    hit gets the kept points of its own lookup: a branch point below its last
    token, 16 (full attention matches at most 19 of its tokens), entry 3;
    not 20, its end (which its running state, entry 4, already is)."""
    kv = manager(full(4), mamba(4))
    assert serve(kv, "a", list(range(24))) == 0
    c_blocks, hit = kv.get_computed_blocks(Request("c", [*range(20), 999]))
    assert (hit, c_blocks.full_hit_tokens) == (0, 20)
    b = Request("b", list(range(20)))
    own_blocks, hit = kv.get_computed_blocks(b)
    assert (hit, own_blocks.full_hit_tokens) == (0, 16)
    assert kv.allocate_slots(b, 20, 0, c_blocks) is not None
    assert real(kv.get_block_ids("b")[1]) == [3, 4]
    kv.check_integrity()


def test_passing_the_lookup_again_on_later_chunks_is_no_new_branch() -> None:
    """Tail 8, alignment learned (candidate 8). ``b`` branches off ``a`` at 16
    (full attention matches 16; no Mamba state there: hit 0) and is prefilled
    one token per step, its caller passing the (empty) hit on every step. Only
    the first step admits b: one branch observation. Counted on every step, 40
    observations of 16, all on the 8-grid, would adopt alignment 8."""
    kv = KVCacheManager(
        config(128, full(4), mamba(4)),
        256,
        cache_policy="hybrid",
        hybrid_tail_tokens=8,
        hybrid_value_weight=0.0,
        hybrid_tail_align=None,
    )
    assert serve(kv, "a", list(range(32))) == 0
    b = Request("b", [*range(16), *range(500, 524)])
    blocks, hit = kv.get_computed_blocks(b)
    assert (hit, blocks.full_hit_tokens) == (0, 16)
    for _ in range(b.num_tokens):
        assert kv.allocate_slots(b, 1, 0, blocks) is not None
        b.num_computed_tokens += 1
    assert kv.policy.tail_alignment.align == 0
    kv.check_integrity()
