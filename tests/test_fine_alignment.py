"""A branch grid no coarser than the full-attention block
(``hybridkv.policy.fine_alignment``): learned from branches at marked prompt
ends and from divergences inside recorded blocks, and where it puts the
prompt-end state (``retention.prompt_point``)."""

from __future__ import annotations

from array import array

import pytest
from factories import config, full, mamba, serve

from hybridkv import KVCacheManager
from hybridkv.policy.fine_alignment import (
    FineAlignment,
    chunk_hashes,
    chunk_size,
)
from hybridkv.policy.retention import prompt_point
from hybridkv.policy.tuning import DEFAULT_TUNING as T

CHANCE, MAX_MARKS, MAX_RECORDS = T.fine_chance, T.max_marks, T.fine_max_records
MIN_OBSERVED, WINDOW = T.learn_min_observed, T.learn_window


def key(i: int) -> bytes:
    return i.to_bytes(8, "little")


def test_candidates_are_powers_of_two_up_to_the_block_and_the_tail() -> None:
    assert FineAlignment(528, 512)._candidates == (4, 8, 16, 32, 64, 128, 256, 512)
    assert FineAlignment(80, 512)._candidates == (4, 8, 16, 32, 64)
    assert FineAlignment(12, 8)._candidates == (4, 8)
    assert FineAlignment(12, 0)._candidates == ()  # no tail: nothing to learn
    assert FineAlignment(528, 512, learn=False)._candidates == ()


def test_only_branches_at_marked_prompt_ends_are_evidence() -> None:
    f = FineAlignment(528, 512)
    for i in range(2 * MIN_OBSERVED):
        f.observe(528 * (i + 1), key(i))  # nobody's prompt ended there
    assert not f._seen and f.align == 0
    f.mark(key(7), 100)
    f.observe(528 * 4, key(7))
    assert list(f._seen) == [(2112, 100)]
    f.check_integrity()


def mooncake_like(count: int) -> list[tuple[int, int]]:
    """``count`` informative observations ``(end, overhang)`` of 528-token blocks
    and branches at multiples of 512 (Mooncake's expansion): prompts of varied
    length whose next turn diverges at the prompt's last multiple of 512, kept
    where that lies in ``[end, n]`` (a next turn that resumes below the prompt's
    last hit boundary is no evidence here)."""
    out = []
    i = 0
    while len(out) < count:
        n = 2_000 + 397 * i
        end, last = n - n % 528, n - n % 512
        if last >= end:
            out.append((end, n - end))
        i += 1
    return out


def feed(f: FineAlignment, observations: list[tuple[int, int]], first_key: int = 0) -> None:
    for i, (end, overhang) in enumerate(observations):
        f.mark(key(first_key + i), overhang)
        f.observe(end, key(first_key + i))


def test_learns_512_on_528_token_blocks() -> None:
    f = FineAlignment(528, 512)
    obs = mooncake_like(MIN_OBSERVED)
    feed(f, obs[:-1])
    assert f.align == 0  # too few to tell
    feed(f, obs[-1:], first_key=MIN_OBSERVED)
    assert f.align == 512
    # every grid of 512 or finer explains every observation; 512 is the largest
    n = len(f._seen)
    assert f._agree == [n] * 8
    # ... and random divergences would fit 512 in about 70 % of them (Mooncake's
    # own: the same), the finer grids in more
    assert 0.65 * 512 * n < f._chance[-1] <= CHANCE * 512 * n
    f.check_integrity()


def test_divergences_off_the_grid_refute_it() -> None:
    f = FineAlignment(528, 512)
    # [2112 + 528 i, + 40] holds a multiple of 512 for i = 26, 27, 28 only: 512 is
    # refuted; 64 fits 3 in 4 (under AGREE); 32 and finer fit any range of 41 tokens
    feed(f, [(2112 + 528 * i, 40) for i in range(MIN_OBSERVED)])
    assert f._agree[-1] == 3
    assert f.align == 0
    f.check_integrity()


def test_a_grid_that_fits_by_chance_is_refused() -> None:
    # An overhang of 11 tokens holds a multiple of 4 or 8 whatever the traffic.
    f = FineAlignment(12, 8)
    feed(f, [(12, 11)] * MIN_OBSERVED)
    assert f._agree == [MIN_OBSERVED, MIN_OBSERVED]
    assert f.align == 0
    # Overhangs of 2 and 5: 8 fits at a chance of (3 + 6) / 2 / 8 = 0.56; 4 at 0.875.
    h = FineAlignment(12, 8)
    feed(h, [(24, 2), (36, 5)] * (MIN_OBSERVED // 2))  # 24 in [24, 26]; 40 in [36, 41]
    assert h.align == 8
    h.check_integrity()


def test_forgets_beyond_the_window_and_marks_beyond_their_bound() -> None:
    f = FineAlignment(528, 512)
    feed(f, mooncake_like(WINDOW))
    assert f.align == 512
    feed(f, [(2640, 40)] * WINDOW, first_key=WINDOW)  # [2640, 2680]: no multiple of 512
    assert len(f._seen) == WINDOW and f.align == 0
    f.check_integrity()
    for i in range(MAX_MARKS + 5):
        f.mark(key(10 * WINDOW + i), 3)
    assert len(f._marks) == MAX_MARKS and key(0) not in f._marks
    f.check_integrity()


def test_a_grid_is_adopted_at_exactly_the_agreement_share() -> None:
    # 32-token blocks, candidates 4..32; 40 observations (0.9 x 40 = 36 exactly).
    # 36 branches on a multiple of 32, 4 at 16 past one with 3 tokens of
    # overhang: only 32 is refuted by them, and it still fits exactly 90 %.
    f = FineAlignment(32, 512)
    feed(f, [(64, 3)] * 36 + [(80, 3)] * 4)
    assert f._agree[-1] == 36 and len(f._seen) == 40
    assert f.align == 32  # 36 >= 0.9 x 40; a strict share would fall back to 16
    f.check_integrity()


def test_a_grid_is_adopted_at_exactly_the_chance_bound() -> None:
    # Every branch on a multiple of 32 (every grid fits). The chance that a
    # random divergence fits 32 is the mean of min(32, r + 1) / 32: 24 ranges of
    # 32 tokens and 16 of 16 give 1,024 / (32 x 40) = 0.8, the bound itself.
    # Every finer grid fits every range by chance and is refused.
    f = FineAlignment(32, 512)
    feed(f, [(64, 31)] * 24 + [(64, 15)] * 16)
    assert f._chance[-1] == CHANCE * 32 * 40
    assert f.align == 32
    f.check_integrity()


def test_a_prompt_end_marked_again_is_the_most_recent() -> None:
    f = FineAlignment(528, 512, tuning=T.replace(max_marks=2))
    f.mark(key(1), 5)
    f.mark(key(2), 6)
    f.mark(key(1), 7)  # renewed: key(2) is now the oldest
    f.mark(key(3), 8)
    assert dict(f._marks) == {key(1): 7, key(3): 8}


def test_check_integrity_catches_a_stale_count() -> None:
    f = FineAlignment(528, 512)
    feed(f, mooncake_like(MIN_OBSERVED))
    f._agree[-1] -= 1
    with pytest.raises(AssertionError, match="agreement"):
        f.check_integrity()


def test_prompt_point_with_a_fine_grid() -> None:
    # Bamba: 528-token steps, branches at multiples of 512.
    assert prompt_point(2651, 528, 0) == 2640  # no grid: the last hit boundary
    assert prompt_point(2651, 528, 0, 512) == 2112  # diverging at 2560 resumes at 2112
    assert prompt_point(2700, 528, 0, 512) == 2112
    assert prompt_point(3100, 528, 0, 512) == 2640  # 3072 lies past 2640
    assert prompt_point(3072, 528, 0, 512) == 2640  # the whole prompt shared: 3072
    assert prompt_point(500, 528, 0, 512) == 0
    # a coarse grid wins: Jamba's 80-token steps on a 512 grid
    assert prompt_point(1000, 80, 512, 64) == prompt_point(1000, 80, 512) == 480


def manager(align: int | None) -> KVCacheManager:
    """Full attention + Mamba, block 12, tail 8 (under one block: no tail, as with
    Bamba's 528-token blocks and the 512-token tail), no floor points."""
    return KVCacheManager(
        config(1024, full(12), mamba(12)),
        512,
        cache_policy="hybrid",
        hybrid_tail_tokens=8,
        hybrid_value_weight=0.0,
        hybrid_floor_tokens=0,
        hybrid_tail_align=align,
    )


def teach(kv: KVCacheManager) -> None:
    """Two-turn conversations in 8-token units: a 26- or 41-token first turn, a
    second that keeps its whole 8-token units (24 or 40 tokens) and goes on."""
    for i in range(MIN_OBSERVED):
        n, keep = (26, 24) if i % 2 else (41, 40)
        first = [10_000 + 100 * i + j for j in range(n)]
        serve(kv, f"a{i}", first)
        # full attention matches 24 or 36 (whole 12-token blocks), where the
        # first turn's state is: its last hit boundary
        hit = serve(kv, f"b{i}", first[:keep] + [90_000 + 100 * i + j for j in range(9)])
        assert hit == keep - keep % 12


def test_a_learned_fine_grid_keeps_the_state_where_the_next_turn_resumes() -> None:
    kv = manager(None)
    teach(kv)
    assert kv.policy.tail_alignment.align == 0  # no grid coarser than 12
    assert kv.policy.tail_alignment.fine.align == 8
    # A 37-token first turn: its last hit boundary is 36, its last 8-token unit
    # ends at 32, so the next turn diverges at 32 and resumes from the state at 24.
    first = list(range(500, 537))
    assert serve(kv, "x", first) == 0
    assert serve(kv, "y", first[:32] + [9999] * 8) == 24

    fixed = manager(0)  # a fixed (dense) tail learns no grid at all
    teach(fixed)
    assert fixed.policy.tail_alignment.fine.align == 0
    serve(fixed, "x", first)
    assert serve(fixed, "y", first[:32] + [9999] * 8) == 0  # the only state is at 36


# -- recorded blocks: divergences before the prompt's last hit boundary ----------
def packed(tokens: list[int]) -> bytes:
    return array("I", tokens).tobytes()


def test_chunks_are_a_32nd_of_the_block_and_at_least_the_finest_grid() -> None:
    assert chunk_size(528) == 16  # Bamba: 33 chunks a block
    assert chunk_size(400) == 12  # Granite: 33 chunks of 12 cover 396 tokens
    assert chunk_size(80) == 4 and chunk_size(12) == 4


def test_chunk_hashes_cover_whole_chunks_inside_the_prompt() -> None:
    p = packed(list(range(100)))
    assert len(chunk_hashes(p, 0, 16, 4)) == 4
    assert len(chunk_hashes(p, 90, 106, 4)) == 2  # tokens 90-97; 98-99 are no chunk
    assert len(chunk_hashes(p, 97, 113, 4)) == 0
    same = packed([*range(40), 7, 7, 7, 7, *range(44, 100)])
    a, b = chunk_hashes(p, 32, 48, 4), chunk_hashes(same, 32, 48, 4)
    assert [x == y for x, y in zip(a, b, strict=True)] == [True, True, False, True]


def bamba_turns() -> tuple[list[int], list[int]]:
    """A 6,077-token prompt (last hit boundary 5,808) and its next turn, which
    keeps its whole 512-token units (5,632 tokens) and goes on."""
    first = list(range(1, 6078))
    return first, first[:5632] + [900_000 + i for i in range(600)]


def test_a_next_turn_diverging_before_the_last_boundary_is_seen_to_the_chunk() -> None:
    f = FineAlignment(528, 512)
    first, second = bamba_turns()
    f.record(key(1), packed(first), 5280)  # the block [5280, 5808), under the block at 5280
    assert list(f._records) == [key(1)] and len(f._records[key(1)]) == 33
    f.observe(5280, key(1), packed(second))
    assert list(f._seen) == [(5632, 15)]  # chunk 22 differs: [5632, 5648)
    # ... which a grid of 512 explains, at a chance of 16 / 512
    assert f._agree[-1] == 1 and f._chance[-1] == 16
    f.check_integrity()


def test_a_recorded_block_is_found_past_the_branch() -> None:
    # The first turn's blocks were evicted: the next turn branches at 0 (or
    # anywhere below), yet its own hashes lead to the recorded block.
    first, second = bamba_turns()
    f = FineAlignment(528, 512)
    f.record(key(1), packed(first), 5280)
    f.observe(0, None, packed(second), [(528, key(50)), (5280, key(1)), (5808, key(51))])
    assert list(f._seen) == [(5632, 15)]
    # the deepest recorded block wins
    g = FineAlignment(528, 512)
    g.record(key(1), packed(first), 5280)
    g.record(key(2), packed(first), 4752)
    g.observe(1056, key(3), packed(second), [(4752, key(2)), (5280, key(1))])
    assert list(g._seen) == [(5632, 15)]
    h = FineAlignment(528, 512)
    h.record(key(2), packed(first), 4752)
    h.observe(1056, key(3), packed(second), [(4752, key(2)), (5280, key(1))])
    assert list(h._seen) == []  # [4752, 5280) is shared whole: no divergence seen


def test_a_prompt_sharing_every_chunk_it_holds_is_no_evidence() -> None:
    first, _ = bamba_turns()
    f = FineAlignment(528, 512)
    f.record(key(1), packed(first), 5280)
    f.observe(5280, key(1), packed(first[:5700]))  # ends inside the block, same tokens
    f.observe(5280, key(1), None)  # no prompt given
    f.observe(5280, key(9), packed([5] * 6000))  # nothing recorded there
    assert not f._seen


def test_a_marked_prompt_end_wins_over_a_record() -> None:
    first, second = bamba_turns()
    f = FineAlignment(528, 512)
    f.record(key(1), packed(first), 5280)
    f.mark(key(1), 100)
    f.observe(5280, key(1), packed(second))
    assert list(f._seen) == [(5280, 100)]


def test_records_are_bounded_and_a_fixed_grid_records_nothing() -> None:
    first, _ = bamba_turns()
    f = FineAlignment(528, 512)
    for i in range(MAX_RECORDS + 3):
        f.record(key(i), packed(first), 528)
    assert len(f._records) == MAX_RECORDS and key(0) not in f._records and key(3) in f._records
    f.record(key(3), packed(first), 528)  # renewed: the newest
    assert next(reversed(f._records)) == key(3)
    f.check_integrity()
    f._records[key(3)] = f._records[key(3)][:-1]
    with pytest.raises(AssertionError, match="one block"):
        f.check_integrity()
    fixed = FineAlignment(528, 512, learn=False)
    assert not fixed.learning
    fixed.record(key(1), packed(first), 5280)
    assert not fixed._records


def test_a_grid_is_learned_from_next_turns_that_diverge_before_the_last_boundary() -> None:
    # 12-token blocks, 8-token units: a 37-token first turn (last hit boundary
    # 36) whose next turn keeps 32 tokens branches at 24, in a block no prompt
    # end marks; the recorded block [24, 36) shows it diverged at 32.
    kv = manager(None)
    for i in range(MIN_OBSERVED):
        first = [10_000 + 100 * i + j for j in range(37)]
        serve(kv, f"a{i}", first)
        assert serve(kv, f"b{i}", first[:32] + [90_000 + 100 * i + j for j in range(9)]) == 0
    fine = kv.policy.tail_alignment.fine
    assert list(fine._seen) == [(32, 3)] * MIN_OBSERVED  # each seen to the 4-token chunk
    assert fine.align == 8  # 4 fits any chunk by chance and is refused
    # Now the next turn resumes from the state at 24 (the prompt's last multiple
    # of 8, 32, rounded down to the block), not from 36.
    first = list(range(500, 537))
    assert serve(kv, "x", first) == 0
    assert serve(kv, "y", first[:32] + [9999] * 8) == 24


def test_a_next_turn_is_evidence_after_its_first_turn_left_the_cache() -> None:
    # 12-token blocks, 4-token chunks. The first turn (37 tokens) records its
    # block [24, 36) under the hash of its block ending at 24; the cache is then
    # emptied, so the next turn matches nothing (branch 0) and finds the record
    # through its own hashes.
    kv = manager(None)
    fine = kv.policy.tail_alignment.fine
    first = list(range(100, 137))
    serve(kv, "a", first)
    assert kv.reset_prefix_cache()
    assert serve(kv, "b", first[:32] + [9_000 + j for j in range(9)]) == 0
    assert list(fine._seen) == [(32, 3)]
    # A prompt that ends 5 tokens past the recorded block's start (its last
    # hashed boundary) still shows one whole chunk there, [24, 28), that differs.
    assert kv.reset_prefix_cache()
    assert serve(kv, "c", first[:24] + [8_000 + j for j in range(5)]) == 0
    assert list(fine._seen) == [(32, 3), (24, 3)]
    # The first block past the branch counts: a 29-token first turn records
    # [12, 24) under its first block; its next turn diverges at 16.
    short = list(range(300, 329))
    serve(kv, "d", short)
    assert kv.reset_prefix_cache()
    assert serve(kv, "e", short[:16] + [7_000 + j for j in range(13)]) == 0
    assert list(fine._seen)[-1] == (16, 3)
    fine.check_integrity()


def test_only_a_prompt_with_two_whole_blocks_records_one() -> None:
    kv = manager(None)
    records = kv.policy.tail_alignment.fine._records
    serve(kv, "a", list(range(100, 124)))  # last hit boundary 24: records [12, 24)
    assert len(records) == 1 and len(next(iter(records.values()))) == 3
    serve(kv, "b", list(range(200, 223)))  # boundary 12: no block before it
    assert len(records) == 1
    lru = KVCacheManager(config(1024, full(12), mamba(12)), 512, hybrid_tail_tokens=8)
    serve(lru, "a", list(range(100, 137)))  # lru records nothing
    assert not lru.policy.keeps_points  # no learner exists under lru
