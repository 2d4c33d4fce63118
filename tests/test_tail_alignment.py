"""The tail's alignment (``hybridkv.policy.tail_alignment``): learned from
branch points, and what it thins (final points, unit values, Mamba snapshots,
prompt points, hits)."""

from __future__ import annotations

import math

import pytest
from factories import config, decode, full, mamba

from hybridkv import KVCacheManager, Request
from hybridkv.managers.points import on_grid, tail_points
from hybridkv.managers.snapshots import snapshot_entries
from hybridkv.policy.retention import FinalPoints, UnitValues, prompt_point
from hybridkv.policy.tail_alignment import TailAlignment
from hybridkv.policy.tuning import DEFAULT_TUNING as T

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


# -- an aligned tail's points (final points, unit values, prompt points) ----


def test_tail_points() -> None:
    # step 80, grid 512: 480 and 960 are on the grid, 1040 is the end
    assert tail_points(1040, 480, 80, 0) == [560, 640, 720, 800, 880, 960, 1040]
    assert tail_points(1040, 560, 80, 512) == [480, 960, 1040]
    assert tail_points(960, 480, 80, 512) == [480, 960]
    assert tail_points(1000, 480, 40, 512) == [1000]  # no grid point in the tail
    assert tail_points(0, 480, 80, 512) == []


def test_tail_points_are_the_boundaries_on_the_grid() -> None:
    """The direct form equals its definition: every boundary in the tail that
    is ``on_grid``, and the end."""
    for step in (16, 40, 80, 512, 528):
        for align in (0, 16, 32, 512, 1024):
            for tail in (0, 80, 480, 560, 2048):
                for end in range(0, 4 * 1056, step):
                    lo = max(step, (end - tail) // step * step) if align else None
                    want = (
                        [p for p in range(lo, end + 1, step) if p == end or on_grid(p, align, step)]
                        if lo is not None
                        else list(range(max(step, -(-(end - tail) // step) * step), end + 1, step))
                    )
                    assert tail_points(end, tail, step, align) == want, (end, tail, step, align)


def test_final_points_top_is_the_aligned_end() -> None:
    p = FinalPoints([400], 1040, 560, 80, 512)
    assert p.tail == [480, 960, 1040] and p.points == [400, 480, 960, 1040]
    assert p.top == 960 and p.end == 1040
    assert FinalPoints([], 960, 560, 80, 512).top == 960  # the end on the grid
    assert FinalPoints([], 1040, 560, 80, 0).top == 1040  # dense: the end
    two = FinalPoints([], 1040, 80, 80, 512)  # the aligned end and the end
    assert two.tail == [960, 1040] and two.top == 960
    assert FinalPoints([], 1000, 480, 40, 512).top == 1000  # no grid point in the tail


def test_unit_values_of_an_aligned_tail() -> None:
    """Points 480 (below), 960 (aligned end), 1040 (off-grid end), step 80.
    Full pages: 12 up to 960, 1 more to 1040. With a Mamba state per point:
    aligned end 960 / 13, end min(960 / 13, 80 / 2); the lower point's own
    state min(960 / 13, 480 / 1)."""
    p = FinalPoints([], 1040, 560, 80, 512)
    v = UnitValues(p, {480: 6, 960: 6, 1040: 1}, {480: 1, 960: 1, 1040: 1})
    assert v.main == [960, 1040]
    assert v.chain == {960: 960 / 13, 1040: 40.0}
    assert v.of_full(480) == v.of_full(960) == 960 / 13 and v.of_full(1040) == 40.0
    assert v.of_other(960, False) == 960 / 13  # a main point: its chain value
    assert v.of_other(480, False) == v.of_other(480, True) == 960 / 13
    full_only = UnitValues(p, {480: 6, 960: 6, 1040: 1}, {})
    assert full_only.chain == {960: 960 / 12, 1040: 80.0}
    assert full_only.of_other(480, False) == 80.0  # saved_by 480 over 1 page, capped


def test_snapshot_entries_keep_every_aligned_tail_point() -> None:
    args = dict(block_size=80, caching=True, hybrid=True, tail=560, step=80)
    # 1100 tokens: entries 0-13; 480 is entry 5, 960 entry 11, 1040 entry 12,
    # the running state entry 13
    assert snapshot_entries(0, 14, 1100, align=512, **args) == [5, 11, 12, 13]
    assert snapshot_entries(0, 14, 1100, **args) == list(range(5, 14))


def test_prompt_point_is_the_last_boundary_on_the_grid() -> None:
    assert prompt_point(1100, 80, 0) == 1040  # dense: the last boundary
    assert prompt_point(1100, 80, 512) == 960  # 1024 lies in [960, 1040)
    assert prompt_point(1040, 80, 512) == 960
    assert prompt_point(400, 80, 512) == 0  # no grid point below: none
    assert prompt_point(70, 80, 0) == 0


def test_a_grid_point_past_the_tokens_serves_no_branch() -> None:
    """Jamba's 80-token steps on a 512 grid: a 1,000-token request ends at 960,
    whose grid point 1,024 lies past its tokens; a request sharing them diverges
    at 512 at most and resumes at 480."""
    assert on_grid(960, 512, 80) and on_grid(960, 512, 80, 1024)
    assert not on_grid(960, 512, 80, 1000)
    assert on_grid(960, 0, 80, 961)
    assert prompt_point(1000, 80, 512) == 480
    p = FinalPoints([], 960, 480, 80, 512, num_tokens=1000)
    assert p.tail == [480, 960] and p.top == 480  # the end is off the grid
    assert FinalPoints([], 960, 480, 80, 512).top == 960  # tokens not given


# -- in the manager ----------------------------------------------------------


def grid_manager(block: int, tail: int, align: int | None) -> KVCacheManager:
    """Full attention + Mamba, both of ``block`` tokens, tail ``tail``, grid
    ``align`` (None: learned), value weight 1."""
    return KVCacheManager(
        config(512, full(block), mamba(block)),
        512,
        cache_policy="hybrid",
        hybrid_tail_tokens=tail,
        hybrid_value_weight=1.0,
        hybrid_tail_align=align,
    )


def test_a_resumed_request_is_no_branch() -> None:
    """A preempted request, readmitted, matches its own earlier progress
    (here 12 tokens): that is no branch point for the learned grid."""
    kv = grid_manager(4, 32, None)
    ta = kv.policy.tail_alignment
    r = Request("r", list(range(1000, 1040)))
    assert kv.allocate_slots(r, 12, 0, None) is not None
    r.num_computed_tokens = 12
    kv.free(r)  # preempted after 12 tokens
    r.num_computed_tokens = 0
    r.num_preemptions = 1
    blocks, hit = kv.get_computed_blocks(r)
    assert hit == 12
    seen = list(ta._seen)
    assert kv.allocate_slots(r, 40 - hit, hit, blocks) is not None
    assert list(ta._seen) == seen
    kv.check_integrity()
    # the same readmission of a request never preempted is one
    s = Request("s", list(range(2000, 2040)))
    assert kv.allocate_slots(s, 12, 0, None) is not None
    s.num_computed_tokens = 12
    kv.free(s)
    s.num_computed_tokens = 0
    blocks, hit = kv.get_computed_blocks(s)
    assert hit == 12
    assert kv.allocate_slots(s, 40 - hit, hit, blocks) is not None
    assert list(ta._seen) == [*seen, 12]


def test_the_prompt_point_is_the_last_grid_point_below_the_end() -> None:
    """Block 12 on a grid of 16, tail 24: a 62-token request keeps its prompt
    point at 48 (the last multiple of 16 in it); a request sharing its first
    48 tokens resumes there."""
    kv = grid_manager(12, 24, 16)
    r = Request("r", list(range(62)))
    blocks, hit = kv.get_computed_blocks(r)
    assert hit == 0 and kv.allocate_slots(r, 62, 0, blocks) is not None
    assert kv.coordinator.managers[0].states["r"].kept == (48,)
    r.num_computed_tokens = 62
    kv.free(r)
    kv.check_integrity()
    assert serve(kv, "next", list(range(48)) + [9] * 20) == 48


def test_the_prompt_end_stays_a_hit_point_after_a_long_answer() -> None:
    """A 40-token prompt answered with 40 tokens: the tail (32 tokens before
    the end at 80) does not reach the prompt's aligned end 32, the kept
    prompt point does. Another sample of the prompt resumes there."""
    kv = grid_manager(4, 32, 16)
    prompt = list(range(3000, 3040))
    r = Request("r", prompt)
    blocks, hit = kv.get_computed_blocks(r)
    assert hit == 0
    assert kv.allocate_slots(r, 40, 0, blocks) is not None
    assert kv.coordinator.managers[0].states["r"].kept == (32,)
    r.num_computed_tokens = 40
    for t in range(40):
        assert decode(kv, r, 7000 + t) is not None
    kv.check_integrity()
    kv.free(r)
    assert serve(kv, "again", prompt + [1] * 8) == 32
