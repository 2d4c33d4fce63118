"""The tail's alignment (``hybridkv.policy.tail_alignment``): learned from
branch points, and what it thins (final points, Mamba snapshots, hits)."""

from __future__ import annotations

import math

import pytest
from factories import config, full, mamba

from hybridkv import KVCacheManager, Request
from hybridkv.managers.points import on_grid
from hybridkv.policy.retention import FinalPoints
from hybridkv.policy.tail_alignment import TailAlignment
from hybridkv.policy.tuning import DEFAULT_TUNING as T
from hybridkv.snapshots import snapshot_entries

AGREE, MIN_OBSERVED, WINDOW = T.grid_agree, T.learn_min_observed, T.learn_window


def test_on_grid_needs_a_multiple_within_one_step() -> None:
    assert on_grid(480, 512, 80)  # 512 lies in [480, 560)
    assert on_grid(512, 512, 80)
    assert not on_grid(400, 512, 80)  # [400, 480) holds no multiple of 512
    assert not on_grid(432, 512, 80)  # 512 is exactly one step past: outside
    assert on_grid(433, 512, 80)
    assert on_grid(400, 0, 80)  # no alignment: every point


def test_candidates_are_powers_of_two_past_the_granularity_up_to_the_tail() -> None:
    assert TailAlignment(16, 512, None)._candidates == (32, 64, 128, 256, 512)
    assert TailAlignment(80, 512, None)._candidates == (128, 256, 512)
    assert TailAlignment(16, 511, None)._candidates == (32, 64, 128, 256)
    assert TailAlignment(16, 0, None)._candidates == ()  # no tail: nothing to learn
    assert TailAlignment(16, 512, 0)._candidates == ()  # fixed: nothing to learn


def test_adopts_the_largest_alignment_after_enough_observations() -> None:
    t = TailAlignment(16, 512, None)
    for _ in range(MIN_OBSERVED - 1):
        t.observe(1024, 5000)
    assert t.align == 0  # too few to tell
    t.observe(1024, 5000)
    assert t.align == 512
    t.check_integrity()


def test_ignores_no_branch_and_matches_cut_by_the_prompt_end() -> None:
    t = TailAlignment(16, 512, None)
    for _ in range(MIN_OBSERVED):
        t.observe(0, 5000)  # diverged in the first block: says nothing
        t.observe(1024, 1040)  # 1024 + 16 >= 1040: the prompt ended the match
    assert len(t._seen) == 0 and t.align == 0
    t.observe(1024, 1041)
    assert list(t._seen) == [1024]
    # at granularity 1, a branch after the first token is evidence
    t1 = TailAlignment(1, 8, None)
    t1.observe(1, 10)
    assert list(t1._seen) == [1]


def test_needs_agree_share_of_the_window() -> None:
    n = MIN_OBSERVED
    need = math.ceil(AGREE * n)  # 29 of 32
    # 1552 = 3 * 512 + 16 agrees with no candidate (not even 32)
    for agreeing, align in ((need - 1, 0), (need, 512)):
        t = TailAlignment(16, 512, None)
        for i in range(n):
            t.observe(1536 if i < agreeing else 1552, 10_000)
        assert t.align == align
        t.check_integrity()
    # exactly AGREE of the window is enough: 36 of 40
    for agreeing, align in ((35, 0), (36, 512)):
        t = TailAlignment(16, 512, None)
        for i in range(40):
            t.observe(1536 if i < agreeing else 1552, 10_000)
        assert t.align == align


def test_forgets_beyond_the_window_and_follows_new_traffic() -> None:
    t = TailAlignment(16, 512, None)
    for _ in range(WINDOW):
        t.observe(2048, 9000)
    assert t.align == 512
    for _ in range(WINDOW):
        t.observe(2048 + 64, 9000)  # now on multiples of 64 only
    assert len(t._seen) == WINDOW
    assert t.align == 64
    t.check_integrity()
    for _ in range(WINDOW):
        t.observe(2048 + 48, 9000)  # 2096: a multiple of 16 only
    assert t.align == 0
    t.check_integrity()
    # 2096 is exactly 16 short of 2112 = 66 * 32: it never agreed with 32,
    # and leaving the window must not count it out again
    for _ in range(WINDOW):
        t.observe(2048, 9000)
    t.check_integrity()
    assert t.align == 512


def test_fixed_alignment_ignores_observations() -> None:
    t = TailAlignment(16, 512, 256)
    assert t.align == 256
    for _ in range(WINDOW):
        t.observe(48, 9000)
    assert t.align == 256
    t.check_integrity()
    assert TailAlignment(16, 512, 0).align == 0


def test_final_points_keep_grid_points_and_the_end() -> None:
    dense = FinalPoints([400], 1040, 480, 80)
    assert dense.points == [400, 560, 640, 720, 800, 880, 960, 1040]
    aligned = FinalPoints([400], 1040, 480, 80, align=512)
    assert aligned.points == [400, 960, 1040]  # 960: 1024 lies in [960, 1040)
    # a hit at 960 would fall to 400, one at 1040 to 960
    assert aligned.saved_by(960) == 560
    assert aligned.saved_by(1040) == 80
    # dense: thinned level by level (``tail_tokens_saved``)
    assert dense.saved_by(960) == 80 and dense.saved_by(880) == 160


def test_final_points_grid_point_just_below_the_tail() -> None:
    # end 1040 - tail 520 = 520: the dense tail starts at 560, but 480 serves
    # a branch at 512, inside the tail: it is kept
    assert FinalPoints([], 1040, 520, 80).points[0] == 560
    assert FinalPoints([], 1040, 520, 80, align=512).points == [480, 960, 1040]
    # a multiple below the tail is not: 1000 - 480 = 520 > 512
    assert FinalPoints([], 1000, 480, 40, align=512).points == [1000]


def test_snapshot_entries_keep_grid_boundaries_and_the_step_end() -> None:
    args = dict(block_size=80, caching=True, hybrid=True, tail=480, step=80)
    assert snapshot_entries(0, 14, 1100, **args) == [6, 7, 8, 9, 10, 11, 12, 13]
    # boundaries 560..960: only 960 (entry 11) is on the 512 grid
    assert snapshot_entries(0, 14, 1100, align=512, **args) == [11, 12, 13]
    assert snapshot_entries(0, 14, 1100, align=512, kept=(160,), **args) == [1, 11, 12, 13]


def test_snapshot_entries_on_the_grid_are_hit_boundaries_only() -> None:
    """Mamba blocks of 4 under a hit step of 8 (full attention on blocks of 8):
    entries end at every multiple of 4, hits land only on multiples of 8. Tail
    32 of 40 tokens, grid 16: states at 16 (entry 3) and 32 (entry 7), and the
    end and running state (entry 9). 12 and 28 have a multiple of 16 within a
    step above them (on_grid), but no hit lands there: no state."""
    assert on_grid(12, 16, 8) and on_grid(28, 16, 8)
    args = dict(block_size=4, caching=True, hybrid=True, tail=32, step=8, align=16)
    assert snapshot_entries(0, 10, 40, **args) == [3, 7, 9]


def manager(align: int | None) -> KVCacheManager:
    """Full attention + Mamba, block 4, tail 16 (grid candidates 8 and 16)."""
    return KVCacheManager(
        config(256, full(4), mamba(4)),
        512,
        cache_policy="hybrid",
        hybrid_tail_tokens=16,
        hybrid_value_weight=0.0,
        hybrid_tail_align=align,
    )


def serve(kv: KVCacheManager, rid: str, tokens: list[int]) -> int:
    req = Request(rid, tokens)
    blocks, hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, len(tokens) - hit, hit, blocks) is not None
    req.num_computed_tokens = len(tokens)
    kv.check_integrity()
    kv.free(req)
    kv.check_integrity()
    return hit


def teach(kv: KVCacheManager, base: list[int]) -> None:
    """Requests that branch off ``base`` at multiples of 16 only."""
    for i in range(MIN_OBSERVED):
        k = 16 * (1 + i % 3)
        serve(kv, f"t{i}", base[:k] + [10_000 + 8 * i + j for j in range(8)])


def test_learned_alignment_thins_the_mamba_tail_and_moves_hits_to_the_grid() -> None:
    base = list(range(64))
    kv = manager(None)
    serve(kv, "base", base)
    teach(kv, base)
    assert kv.policy.tail_alignment.align == 16
    assert kv.policy.grid == 16  # what new Mamba tables are given
    # a 40-token request keeps states at 32 (on the grid) and 40 (its end)
    serve(kv, "r", list(range(500, 540)))
    # a branch at 36 can only resume at 32
    assert serve(kv, "b", list(range(500, 536)) + [9999] * 8) == 32

    dense = manager(0)
    serve(dense, "base", base)
    teach(dense, base)
    assert dense.policy.tail_alignment.align == 0
    serve(dense, "r", list(range(500, 540)))
    assert serve(dense, "b", list(range(500, 536)) + [9999] * 8) == 36

    fixed = manager(16)
    serve(fixed, "r", list(range(500, 540)))
    assert serve(fixed, "b", list(range(500, 536)) + [9999] * 8) == 32


@pytest.mark.parametrize("bad", [-1, 1.5, True, "16"])
def test_bad_alignment_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match="hybrid_tail_align must be None"):
        manager(bad)  # type: ignore[arg-type]
