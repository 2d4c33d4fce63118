"""Tail demand (``hybridkv.policy.tail_demand``): which aligned tail points
later requests branch at, learned from marks; and how its weights value what
only those points need (final points, unit values, eviction order)."""

from __future__ import annotations

import pytest
from factories import config, decode, free_ids, full, mamba, serve, swa

from hybridkv import KVCacheManager, Request
from hybridkv.managers.points import on_grid, tail_points
from hybridkv.policy.retention import FinalPoints, UnitValues, prompt_point
from hybridkv.policy.tail_alignment import TailAlignment
from hybridkv.policy.tail_demand import (
    AT_END,
    BELOW,
    OFF_GRID_END,
    UNMARKED,
    TailDemand,
)
from hybridkv.policy.tuning import DEFAULT_TUNING as T
from hybridkv.snapshots import snapshot_entries

MAX_MARKS, MIN_OBSERVED, WINDOW = T.max_marks, T.learn_min_observed, T.learn_window


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


# -- the learner -----------------------------------------------------------


def test_weights_are_one_until_enough_admissions() -> None:
    d = TailDemand()
    d.mark(key(1), AT_END)
    for _ in range(MIN_OBSERVED - 1):
        d.observe(key(1))
    assert d.below_weight == d.end_weight == 1.0  # too few to tell
    d.check_integrity()
    d.observe(key(1))
    assert d.below_weight == d.end_weight == 1 / (MIN_OBSERVED + 1)
    d.check_integrity()


def test_weights_are_shares_relative_to_aligned_ends() -> None:
    d = TailDemand()
    d.mark(key(1), AT_END)
    d.mark(key(2), BELOW)
    d.mark(key(3), OFF_GRID_END)
    for i in range(100):
        d.observe(key(2) if i < 9 else key(3) if i < 12 else key(1) if i < 92 else key(99))
    assert d._counts == [8, 80, 9, 3]  # key 99: unmarked, still remembered
    assert d.below_weight == 10 / 81 and d.end_weight == 4 / 81
    d.check_integrity()
    # more branches below than at aligned ends: capped at 1
    d = TailDemand()
    d.mark(key(2), BELOW)
    for _ in range(MIN_OBSERVED):
        d.observe(key(2))
    assert d.below_weight == 1.0 and d.end_weight == 1 / 1
    assert d._counts[UNMARKED] == 0


def test_forgets_beyond_the_window_and_weighs_a_kind_back_up() -> None:
    d = TailDemand()
    d.mark(key(1), AT_END)
    d.mark(key(2), BELOW)
    for _ in range(WINDOW):
        d.observe(key(1))
    assert d.below_weight == 1 / (WINDOW + 1)
    for _ in range(WINDOW // 2):
        d.observe(key(2))  # demand grows back: every point is still marked
    assert len(d._seen) == WINDOW
    assert d.below_weight == (WINDOW // 2 + 1) / (WINDOW // 2 + 1) == 1.0
    d.check_integrity()
    for _ in range(WINDOW):
        d.observe(key(1))
    assert d.below_weight == 1 / (WINDOW + 1)
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
    assert d.below_weight < 1
    d.reset()
    assert d.below_weight == d.end_weight == 1.0 and not d._marks and not d._seen
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
    d.below_weight = 0.5
    with pytest.raises(AssertionError, match="before learn_min_observed"):
        d.check_integrity()
    for _ in range(MIN_OBSERVED):
        d.observe(key(1))
    d.end_weight = 0.5
    with pytest.raises(AssertionError, match="stale weights"):
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
    assert t.demand.below_weight < 1
    t.check_integrity()
    t.observe(1024, 5000)  # the same grid again: what was learned stays
    assert t.demand.below_weight < 1 and t.demand._marks
    for _ in range(WINDOW):
        t.observe(1024 + 64, 5000)  # the grid moves to 64: marks meant 512
    assert t.align == 64 and t.demand.below_weight == 1.0 and not t.demand._marks
    t.check_integrity()


# -- final points and unit values ---------------------------------------------


def test_tail_points() -> None:
    # step 80, grid 512: 480 and 960 are on the grid, 1040 is the end
    assert tail_points(1040, 480, 80, 0) == [560, 640, 720, 800, 880, 960, 1040]
    assert tail_points(1040, 560, 80, 512) == [480, 960, 1040]
    assert tail_points(960, 480, 80, 512) == [480, 960]
    assert tail_points(1000, 480, 40, 512) == [1000]  # no grid point in the tail
    assert tail_points(0, 480, 80, 512) == []


def test_final_points_top_and_weights() -> None:
    p = FinalPoints([400], 1040, 560, 80, 512, below_weight=0.25, end_weight=0.125)
    assert p.tail == [480, 960, 1040] and p.points == [400, 480, 960, 1040]
    assert p.top == 960 and p.end == 1040
    assert [p.weight(x) for x in (400, 480, 960, 1040)] == [1.0, 0.25, 1.0, 0.125]
    # a kept point is weighed 1 wherever it is
    assert FinalPoints([480], 1040, 560, 80, 512, 0.25, 0.125).weight(480) == 1.0
    # the end on the grid is the aligned end
    on = FinalPoints([], 960, 560, 80, 512, 0.25, 0.125)
    assert on.top == 960 and on.weight(960) == 1.0 and on.weight(480) == 0.25
    # dense, or no grid point in the tail: the end is the top, every weight 1
    dense = FinalPoints([], 1040, 560, 80, 0, 0.25, 0.125)
    assert dense.top == 1040 and {dense.weight(x) for x in dense.points} == {1.0}
    # a tail of two points: the aligned end and the end
    two = FinalPoints([], 1040, 80, 80, 512, 0.25, 0.125)
    assert two.tail == [960, 1040] and two.top == 960 and two.weight(1040) == 0.125
    lone = FinalPoints([], 1000, 480, 40, 512, 0.25, 0.125)
    assert lone.top == 1000 and lone.weight(1000) == 1.0


def test_unit_values_weigh_the_end_and_the_lower_points() -> None:
    """Points 480 (below), 960 (aligned end), 1040 (off-grid end), step 80.
    Full pages: 12 up to 960, 1 more to 1040. Extra pages (a Mamba state
    each): 1 per point. Aligned end: 960 / 13; end: min(960/13, 80/2) x 1/8;
    the lower point's state: min(960/13, 480/1) x 1/4."""
    p = FinalPoints([], 1040, 560, 80, 512, below_weight=0.25, end_weight=0.125)
    v = UnitValues(p, {480: 6, 960: 6, 1040: 1}, {480: 1, 960: 1, 1040: 1})
    assert v.main == [960, 1040]
    assert v.chain[960] == 960 / 13 and v.chain[1040] == 40 * 0.125
    assert v.of_full(480) == v.of_full(960) == 960 / 13 and v.of_full(1040) == 5.0
    assert v.of_other(960, False) == 960 / 13  # a main point: its chain value
    assert v.of_other(480, False) == 960 / 13 * 0.25  # its own state, weighed
    assert v.of_other(480, True) == 960 / 13  # needed by the aligned end too
    # weights 1: the same split, nothing weighed
    one = UnitValues(FinalPoints([], 1040, 560, 80, 512), {480: 6, 960: 6, 1040: 1}, {})
    assert one.chain == {960: 960 / 12, 1040: 80.0} and one.of_other(480, False) == 80.0


def test_snapshot_entries_keep_every_aligned_tail_point() -> None:
    args = dict(block_size=80, caching=True, hybrid=True, tail=560, step=80)
    # 1100 tokens: entries 0-13; 480 is entry 5, 960 entry 11, 1040 entry 12,
    # the running state entry 13
    assert snapshot_entries(0, 14, 1100, align=512, **args) == [5, 11, 12, 13]
    assert snapshot_entries(0, 14, 1100, **args) == list(range(5, 14))


# -- in the manager ----------------------------------------------------------


def make(second: object) -> KVCacheManager:
    """Full attention + ``second``, block 4, tail 32, grid 16, value weight 1."""
    return KVCacheManager(
        config(512, full(4), second),  # type: ignore[arg-type]
        512,
        cache_policy="hybrid",
        hybrid_tail_tokens=32,
        hybrid_value_weight=1.0,
        hybrid_tail_align=16,
    )


def aligned(block: int, tail: int, align: int, num_blocks: int = 64) -> KVCacheManager:
    """Full attention + Mamba, both of ``block`` tokens, tail ``tail``, grid ``align``."""
    return KVCacheManager(
        config(num_blocks, full(block), mamba(block)),
        512,
        cache_policy="hybrid",
        hybrid_tail_tokens=tail,
        hybrid_tail_align=align,
    )


def conversations(kv: KVCacheManager, n: int) -> None:
    """``n`` two-turn conversations: the second turn resumes at the first's
    aligned end 32 (its prompt ends at 40, off the grid of 16)."""
    for i in range(n):
        first = [100_000 * (i + 1) + j for j in range(40)]
        assert serve(kv, f"c{i}a", first) == 0
        assert serve(kv, f"c{i}b", first[:32] + [7] * 12) == 32


def freed_order(kv: KVCacheManager, tokens: list[int]) -> tuple[list[int], list[list[int]]]:
    """Serve ``tokens`` from scratch and free it: its block ids in the order
    they would be reused, and its block ids per group."""
    r = Request("r", tokens)
    assert kv.allocate_slots(r, len(tokens), 0, None) is not None
    ids = [[b.block_id for b in m.states["r"].blocks] for m in kv.coordinator.managers]
    r.num_computed_tokens = len(tokens)
    kv.free(r)
    kv.check_integrity()
    mine = {i for g in ids for i in g}
    return [i for i in free_ids(kv) if i in mine], ids


def test_conversation_traffic_weighs_down_lower_and_off_grid_points() -> None:
    """A 40-token request's tail: 16 (below), 32 (aligned end), 40 (off-grid
    end); Mamba states at entries 3, 7 and 9. Conversations only ever resume
    at aligned ends, so what only 16 or 40 needs (the state at 16; full
    blocks 8-9 and the state at 40) is reused before the aligned end's unit."""
    kv = make(mamba(4))
    demand = kv.policy.tail_alignment.demand
    conversations(kv, MIN_OBSERVED)
    assert demand._counts[AT_END] == MIN_OBSERVED
    assert demand.below_weight == demand.end_weight == 1 / (MIN_OBSERVED + 1)
    order, (full_ids, states) = freed_order(kv, list(range(500, 540)))
    rare = {full_ids[8], full_ids[9], states[3], states[9]}
    assert set(order[:4]) == rare
    assert set(order[4:]) == {*full_ids[:8], states[7]}
    # unweighted (a fresh manager), the state at 16 is worth the aligned end's
    fresh = make(mamba(4))
    order, (full_ids, states) = freed_order(fresh, list(range(500, 540)))
    assert states[3] not in order[:4]


def test_branches_below_aligned_ends_keep_the_lower_points_weighed_up() -> None:
    """Traffic that re-sends a request without its last grid unit (an edited
    last message) branches below aligned ends: their weight stays 1."""
    kv = make(mamba(4))
    demand = kv.policy.tail_alignment.demand
    for i in range(MIN_OBSERVED):
        base = [100_000 * (i + 1) + j for j in range(48)]  # 16, 32 below; 48 on the grid
        serve(kv, f"e{i}a", base)
        assert serve(kv, f"e{i}b", base[:32] + [7] * 12) == 32
    assert demand._counts[BELOW] == MIN_OBSERVED
    assert demand._counts[AT_END] == 0
    # relative to aligned ends, which nobody resumed at either: (0 + 1) / (0 + 1)
    assert demand.below_weight == demand.end_weight == 1.0


def test_sliding_window_blocks_only_rare_points_need_go_first() -> None:
    """Full + a 16-token sliding window, block 4. The 40-token request's
    window blocks 0-3 serve only the point 16, 8-9 only the end 40 (with full
    blocks 8-9): after conversation traffic they are reused before the
    aligned end's unit (full 0-7, window 4-7)."""
    kv = make(swa(4, 16))
    conversations(kv, MIN_OBSERVED)
    order, (full_ids, win) = freed_order(kv, list(range(500, 540)))
    rare = {full_ids[8], full_ids[9], *(win[i] for i in (0, 1, 2, 3, 8, 9))}
    assert set(order[:8]) == rare
    assert set(order[8:]) == {*full_ids[:8], *win[4:8]}
    fresh = make(swa(4, 16))
    order, (full_ids, win) = freed_order(fresh, list(range(500, 540)))
    assert not {win[0], win[1], win[2], win[3]} & set(order[:4])


def test_branch_points_feed_demand_from_the_first_block_on() -> None:
    """Grid 4 on blocks of 4: every boundary is on the grid, so a freed
    request's aligned end is its end. A branch after one block (key of block
    0) is observed; a request with no match at all is not."""
    kv = aligned(4, 8, 4)
    demand = kv.policy.tail_alignment.demand
    assert serve(kv, "a", [1, 2, 3, 4, 5, 6]) == 0  # E = 4: marks block 0
    assert not demand._seen  # no branch, nothing observed
    assert serve(kv, "b", [1, 2, 3, 4, 9, 9, 9]) == 4
    assert list(demand._seen) == [AT_END]
    assert serve(kv, "c", [7, 7, 7, 7, 7]) == 0
    assert list(demand._seen) == [AT_END]


def test_a_resumed_request_is_no_branch() -> None:
    """A preempted request, readmitted, matches its own earlier progress
    (here 12 tokens, off the grid of 16): that is no branch point."""
    kv = make(mamba(4))
    ta = kv.policy.tail_alignment
    ta.demand.mark(b"x", AT_END)
    r = Request("r", list(range(1000, 1040)))
    assert kv.allocate_slots(r, 12, 0, None) is not None
    r.num_computed_tokens = 12
    kv.free(r)  # preempted after 12 tokens
    r.num_computed_tokens = 0
    r.num_preemptions = 1
    blocks, hit = kv.get_computed_blocks(r)
    assert hit == 12
    seen = (list(ta._seen), list(ta.demand._seen))
    assert kv.allocate_slots(r, 40 - hit, hit, blocks) is not None
    assert (list(ta._seen), list(ta.demand._seen)) == seen
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
    assert len(ta.demand._seen) == len(seen[1]) + 1


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
    p = FinalPoints([], 960, 480, 80, 512, 0.25, 0.125, num_tokens=1000)
    assert p.tail == [480, 960] and p.top == 480
    assert p.weight(480) == 1.0 and p.weight(960) == 0.125  # the end is off the grid
    unknown = FinalPoints([], 960, 480, 80, 512, 0.25, 0.125)  # tokens not given
    assert unknown.top == 960 and unknown.weight(480) == 0.25


def test_the_manager_marks_an_end_past_the_last_grid_point_off_the_grid() -> None:
    """Block 12 on a grid of 16, tail 24: a 62-token request keeps its prompt
    point at 48 (the last multiple of 16 in it); its tail is 48 and its end 60,
    whose grid point 64 it never reached, so 60 is marked an off-grid end."""
    kv = aligned(12, 24, 16)
    r = Request("r", list(range(62)))
    blocks, hit = kv.get_computed_blocks(r)
    assert hit == 0 and kv.allocate_slots(r, 62, 0, blocks) is not None
    assert kv.coordinator.managers[0].states["r"].kept == (48,)
    full_blocks = kv.coordinator.managers[0].states["r"].blocks
    r.num_computed_tokens = 62
    kv.free(r)
    kv.check_integrity()
    marks = kv.policy.tail_alignment.demand._marks
    assert marks[full_blocks[3].block_hash] == AT_END  # ends at 48
    assert marks[full_blocks[4].block_hash] == OFF_GRID_END  # ends at 60
    assert serve(kv, "next", list(range(48)) + [9] * 20) == 48


def test_the_prompt_end_stays_a_hit_point_after_a_long_answer() -> None:
    """A 40-token prompt answered with 40 tokens: the tail (32 tokens before
    the end at 80) does not reach the prompt's aligned end 32, the kept
    prompt point does. Another sample of the prompt resumes there."""
    kv = make(mamba(4))
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
