"""Tail demand (``hybridkv.managers.tail_demand``): which aligned tail points
later requests branch at, learned from marks; and what dropping a kind does
to final points, Mamba snapshots and hits."""

from __future__ import annotations

import math

import pytest
from factories import config, free_ids, full, mamba, swa

from hybridkv import KVCacheManager, Request
from hybridkv.managers.retention import FinalPoints
from hybridkv.managers.tail_alignment import TailAlignment, tail_points
from hybridkv.managers.tail_demand import (
    AT_END,
    BELOW,
    MAX_MARKS,
    MIN_OBSERVED,
    MIN_SHARE,
    OFF_GRID_END,
    UNMARKED,
    WINDOW,
    TailDemand,
)
from hybridkv.snapshots import snapshot_entries


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


# -- the learner -----------------------------------------------------------


def test_keeps_every_kind_until_enough_admissions() -> None:
    d = TailDemand()
    d.mark(key(1), AT_END)
    for _ in range(MIN_OBSERVED - 1):
        d.observe(key(1))
    assert d.below and d.off_grid_end  # too few to tell
    d.check_integrity()
    d.observe(key(1))
    assert not d.below and not d.off_grid_end
    d.check_integrity()


def test_a_kind_needs_min_share_of_the_window() -> None:
    n = 100
    need = math.ceil(MIN_SHARE * n)  # 5 of 100
    for below, kept in ((need - 1, False), (need, True)):
        d = TailDemand()
        d.mark(key(1), AT_END)
        d.mark(key(2), BELOW)
        d.mark(key(3), OFF_GRID_END)
        for i in range(n):
            d.observe(key(2) if i < below else key(1))
        assert d.below is kept and not d.off_grid_end
        d.check_integrity()
    d = TailDemand()
    d.mark(key(3), OFF_GRID_END)
    for i in range(n):
        d.observe(key(3) if i < need else key(99))  # 99: unmarked, still counted
    assert d.off_grid_end and not d.below
    assert d._counts[UNMARKED] == n - need


def test_forgets_beyond_the_window_and_brings_a_kind_back() -> None:
    d = TailDemand()
    d.mark(key(1), AT_END)
    d.mark(key(2), BELOW)
    for _ in range(WINDOW):
        d.observe(key(1))
    assert not d.below
    for _ in range(math.ceil(MIN_SHARE * WINDOW)):
        d.observe(key(2))  # demand grows back: dropped points are still marked
    assert d.below and len(d._seen) == WINDOW
    d.check_integrity()
    for _ in range(WINDOW):
        d.observe(key(1))
    assert not d.below
    d.check_integrity()


def test_aligned_end_wins_a_shared_mark_and_marks_are_bounded() -> None:
    d = TailDemand()
    d.mark(key(1), BELOW)
    d.mark(key(1), AT_END)
    d.mark(key(1), OFF_GRID_END)
    assert d._marks[key(1)] == AT_END
    for i in range(2, MAX_MARKS + 2):
        d.mark(key(i), BELOW)
    assert len(d._marks) == MAX_MARKS
    assert key(1) not in d._marks and key(2) in d._marks  # the oldest goes first
    d.mark(key(2), BELOW)  # marking again makes it the newest
    d.mark(key(10**9), BELOW)
    assert key(2) in d._marks and key(3) not in d._marks
    d.check_integrity()


def test_reset_forgets_everything() -> None:
    d = TailDemand()
    d.mark(key(1), AT_END)
    for _ in range(MIN_OBSERVED):
        d.observe(key(1))
    assert not d.below
    d.reset()
    assert d.below and d.off_grid_end and not d._marks and not d._seen
    assert d._counts == [0, 0, 0, 0]
    d.check_integrity()


def test_check_integrity_catches_drift() -> None:
    d = TailDemand()
    d.mark(key(1), AT_END)
    d.observe(key(1))
    d._counts[AT_END] += 1
    with pytest.raises(AssertionError, match="counts off"):
        d.check_integrity()
    d = TailDemand()
    d.below = False
    with pytest.raises(AssertionError, match="before MIN_OBSERVED"):
        d.check_integrity()


def test_alignment_feeds_demand_only_while_aligned_and_resets_it_on_change() -> None:
    t = TailAlignment(16, 512, None)
    t.demand.mark(key(1), AT_END)
    for _ in range(MIN_OBSERVED):
        t.observe_key(key(1))  # dense: nothing to learn yet
    assert not t.demand._seen
    for _ in range(MIN_OBSERVED):
        t.observe(1024, 5000)
    assert t.align == 512
    t.demand.mark(key(1), AT_END)
    for _ in range(MIN_OBSERVED):
        t.observe_key(key(1))
    assert not t.demand.below
    t.check_integrity()
    for _ in range(WINDOW):
        t.observe(1024 + 64, 5000)  # the grid moves to 64: marks meant 512
    assert t.align == 64 and t.demand.below and not t.demand._marks
    t.check_integrity()


# -- what a kind's absence changes -----------------------------------------


def test_tail_points_by_kind() -> None:
    # step 80, tail 480, grid 512: 480 and 960 are on the grid, 1040 is the end
    assert tail_points(1040, 480, 80, 0) == [560, 640, 720, 800, 880, 960, 1040]
    assert tail_points(1040, 560, 80, 512) == [480, 960, 1040]
    assert tail_points(1040, 560, 80, 512, below=False) == [960, 1040]
    assert tail_points(1040, 560, 80, 512, off_grid_end=False) == [480, 960]
    assert tail_points(1040, 560, 80, 512, False, False) == [960]
    # an end on the grid is the aligned end: kept whatever the flags
    assert tail_points(960, 480, 80, 512, False, False) == [960]
    # no grid point in the tail: the end is all there is
    assert tail_points(1000, 480, 40, 512, False, False) == [1000]
    assert tail_points(0, 480, 80, 512) == []


def test_final_points_end_is_the_highest_point_kept() -> None:
    p = FinalPoints([400], 1040, 560, 80, 512, below=False, off_grid_end=False)
    assert p.points == [400, 960] and p.end == 960
    # a kept point above the aligned end stays the top
    p = FinalPoints([1000], 1040, 560, 80, 512, below=False, off_grid_end=False)
    assert p.points == [960, 1000] and p.end == 1000
    assert FinalPoints([400], 1040, 560, 80, 512).end == 1040
    assert FinalPoints([], 0, 560, 80, 512).end == 0


def test_snapshot_entries_follow_the_kinds() -> None:
    args = dict(block_size=80, caching=True, hybrid=True, tail=560, step=80, align=512)
    # 1100 tokens: entries 0-13; 480 is entry 5, 960 entry 11, 1040 entry 12,
    # the running state entry 13
    assert snapshot_entries(0, 14, 1100, **args) == [5, 11, 12, 13]
    assert snapshot_entries(0, 14, 1100, below=False, **args) == [11, 12, 13]
    assert snapshot_entries(0, 14, 1100, off_grid_end=False, **args) == [5, 11, 13]
    assert snapshot_entries(0, 14, 1100, below=False, off_grid_end=False, **args) == [11, 13]
    dense = dict(args, align=0)  # every boundary from 480 (the flags mean nothing)
    assert snapshot_entries(0, 14, 1100, below=False, off_grid_end=False, **dense) == list(
        range(5, 14)
    )


# -- in the manager ----------------------------------------------------------


def jamba_like(align: int | None = 16) -> KVCacheManager:
    """Full attention + Mamba, block 4, tail 16, grid 16."""
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


def conversations(kv: KVCacheManager, n: int) -> None:
    """``n`` two-turn conversations: the second turn resumes at the first's
    aligned end (its prompt ends 8 tokens past a multiple of 16)."""
    for i in range(n):
        first = [100_000 * (i + 1) + j for j in range(40)]
        assert serve(kv, f"c{i}a", first) == 0
        assert serve(kv, f"c{i}b", first[:32] + [7] * 12) == 32


def freed_head(kv: KVCacheManager, tokens: list[int], n: int) -> tuple[set[int], list[list[int]]]:
    """Serve ``tokens`` from scratch, free it; the first ``n`` free block ids
    (the next evicted) and the request's block ids per group."""
    r = Request("r", tokens)
    assert kv.allocate_slots(r, len(tokens), 0, None) is not None
    ids = [[b.block_id for b in m.states["r"].blocks] for m in kv.coordinator.managers]
    r.num_computed_tokens = len(tokens)
    kv.free(r)
    kv.check_integrity()
    head = set(free_ids(kv)[:n])
    return head, ids


def test_conversation_traffic_drops_lower_and_off_grid_points() -> None:
    kv = jamba_like()
    demand = kv.coordinator.tail_alignment.demand
    conversations(kv, MIN_OBSERVED)
    assert demand._counts[AT_END] == MIN_OBSERVED
    assert not demand.below and not demand.off_grid_end
    # A 40-token request: its tail candidates are 24..40 (step 4); 32 is the
    # aligned end, 40 its off-grid end. Only 32 is kept: the full blocks past
    # it (8, 9) and the state at 40 (entry 9) are the next evicted.
    tokens = list(range(500, 540))
    head, (full_ids, state_ids) = freed_head(kv, tokens, 3)
    assert head == {full_ids[8], full_ids[9], state_ids[9]}
    assert state_ids[7] not in head and full_ids[7] not in head
    # Evicted, a request that repeats it resumes at 32.
    kv.block_pool.free_blocks(kv.block_pool.get_new_blocks(3))
    assert serve(kv, "again", tokens + [9] * 8) == 32
    # A fresh manager keeps the end: the same blocks are not next.
    fresh = jamba_like()
    head, (full_ids, state_ids) = freed_head(fresh, tokens, 3)
    assert not head & {full_ids[8], full_ids[9], state_ids[9]}
    assert serve(fresh, "again", tokens + [9] * 8) == 40


def test_dropped_points_hold_no_state_while_running() -> None:
    kv = jamba_like()
    conversations(kv, MIN_OBSERVED)
    r = Request("r", list(range(500, 540)))
    blocks, hit = kv.get_computed_blocks(r)
    assert hit == 0
    assert kv.allocate_slots(r, 40, 0, blocks) is not None
    table = kv.coordinator.managers[1].states["r"].blocks
    real = [j for j, b in enumerate(table) if not b.is_null]
    # entry 7 (state at 32: the aligned end) and entry 9 (the running state,
    # at 40): nothing at 24 or 28, and the end is only the running state
    assert real == [7, 9]
    fresh = jamba_like()
    fresh.allocate_slots(Request("r", list(range(500, 540))), 40, 0, None)
    table = fresh.coordinator.managers[1].states["r"].blocks
    assert [j for j, b in enumerate(table) if not b.is_null] == [7, 9]  # 36 is off the grid too


def test_edits_of_the_last_unit_keep_the_lower_points() -> None:
    """Traffic that re-sends a request without its last grid unit (an edited
    last message) branches below aligned ends: those points stay."""
    kv = jamba_like()
    demand = kv.coordinator.tail_alignment.demand
    for i in range(MIN_OBSERVED):
        base = [100_000 * (i + 1) + j for j in range(48)]  # ends on the grid
        serve(kv, f"e{i}a", base)
        assert serve(kv, f"e{i}b", base[:32] + [7] * 12) == 32
    assert demand._counts[BELOW] == MIN_OBSERVED
    assert demand.below and not demand.off_grid_end
    tokens = list(range(500, 548))
    serve(kv, "r", tokens)
    assert serve(kv, "edit", tokens[:32] + [9] * 12) == 32


def test_sliding_window_blocks_of_dropped_points_go_first() -> None:
    """Full + a 16-token sliding window, block 4, grid 16, tail 16. After
    conversation traffic, a freed 40-token request keeps the window of its
    aligned end 32 (blocks 4-7) and full blocks 0-7; its full blocks 8-9 and
    window blocks 8-9 (needed only by the end 40) are released evict-first,
    with the window blocks no point needs (0-3)."""
    kv = KVCacheManager(
        config(512, full(4), swa(4, 16)),
        512,
        cache_policy="hybrid",
        hybrid_tail_tokens=16,
        hybrid_value_weight=0.0,
        hybrid_tail_align=16,
    )
    conversations(kv, MIN_OBSERVED)
    assert not kv.coordinator.tail_alignment.demand.below
    r = Request("r", list(range(500, 540)))
    blocks, _ = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, 40, 0, blocks) is not None
    full_ids = [b.block_id for b in kv.coordinator.managers[0].states["r"].blocks]
    win_ids = [b.block_id for b in kv.coordinator.managers[1].states["r"].blocks]
    r.num_computed_tokens = 40
    kv.free(r)
    kv.check_integrity()
    dead = {full_ids[8], full_ids[9], *(win_ids[i] for i in (0, 1, 2, 3, 8, 9))}
    assert set(free_ids(kv)[:8]) == dead
    kv.block_pool.free_blocks(kv.block_pool.get_new_blocks(8))  # evicted
    assert serve(kv, "again", list(range(500, 540)) + [9] * 8) == 32
