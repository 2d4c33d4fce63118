"""``hybrid`` free points, worked by hand with exact block ids.

A hit at a chunk boundary needs no chunked block (the chunk it would read is
empty): when every group without full attention's rule is chunked, the
multiples of the common chunk period are *free points* (``FinalPoints.is_free``).
A freed request keeps them for nothing, and the full-attention blocks on the
way to one are valued by that point's own ratio, not capped by a shallower
point's chunk (``UnitValues.full_value``).

Reading a queue: ``kv.block_pool.policy`` iterates in take order (head first).
"""

from __future__ import annotations

import pytest
from factories import admit, chunked, config, free_classes, full, mamba, swa

from hybridkv import KVCacheManager, Request
from hybridkv.managers.base import RequestBlockState
from hybridkv.policy.retention import FinalPoints, UnitValues


def manager(*specs, num_blocks=64) -> KVCacheManager:
    """``hybrid``, no tail, value weight 1."""
    return KVCacheManager(
        config(num_blocks, *specs),
        256,
        cache_policy="hybrid",
        hybrid_tail_tokens=0,
        hybrid_value_weight=1.0,
    )


def compute(kv: KVCacheManager, rid: str, tokens: list[int]) -> tuple[Request, int]:
    """Admit with its prefix hit and compute the whole prompt; returns the hit."""
    req = Request(rid, tokens)
    return req, admit(kv, req)[0]


@pytest.mark.parametrize(
    ("specs", "period"),
    [
        ((full(4), chunked(4, 8)), 8),
        ((full(4), chunked(4, 8), chunked(2, 12)), 24),
        ((full(4), chunked(6, 12)), 12),
        ((full(4), swa(4, 8)), 0),
        ((full(4), chunked(4, 8), swa(4, 8)), 0),
        ((full(4), chunked(4, 8), mamba(4)), 0),
    ],
)
def test_the_free_point_period(specs, period) -> None:
    """The lcm of the block sizes and every group's period: full attention 1
    (every point), a chunk its size; a window or a state has none, so any
    such group leaves the layout without free points."""
    assert manager(*specs).policy.free_point_period == period


@pytest.mark.parametrize(
    ("specs", "policy", "only"),
    [
        ((full(4), chunked(4, 8)), "hybrid", True),
        ((full(4), chunked(4, 8)), "lru", True),
        ((full(4), chunked(4, 6)), "hybrid", False),
        ((full(4), chunked(4, 8), mamba(4)), "hybrid", False),
        ((full(4), chunked(4, 8), swa(4, 8)), "hybrid", False),
    ],
)
def test_when_a_running_chunked_group_holds_only_its_chunk(specs, policy, only) -> None:
    """At a chunk's start (24 tokens, chunk 8 or 6 on blocks of 4), the
    chunked group releases every earlier block (``release_stop`` = its first
    needed block) under ``lru``, and under ``hybrid`` only with free points
    (every other group chunked: a tail point owns no block a missing chunk
    would strand) and chunks on the hit step (``E`` is never in an earlier
    chunk); elsewhere ``hybrid`` holds the 512-token tail's needs."""
    kv = KVCacheManager(config(64, *specs), 256, cache_policy=policy)
    (m,) = [m for m in kv.coordinator.managers if hasattr(m, "attention_chunk_size")]
    st = RequestBlockState([kv.block_pool.null_block] * 8, 0, 0)
    assert (m.release_stop(st, 24) == m.first_needed_block(24) > 0) == only


def test_lru_keeps_no_free_points() -> None:
    kv = KVCacheManager(config(64, full(4), chunked(4, 8)), 256, cache_policy="lru")
    assert not kv.policy.keeps_points  # no kept points, free or not


def test_free_points_split_the_end_unit_by_hand() -> None:
    """Full attention and an 8-token chunk, blocks of 4, value weight 1.

    ``a`` computes 20 tokens: full blocks 1-5, chunked 6-10. E = 20, and the
    free points are 8 and 16. Chunked 6-9 (tokens 0-15) no point needs: a hit
    at 8 or 16 reads no chunked block, one at 20 only the chunk from 16 (10).
    Units: 8 holds full 1-2 (8 tokens / 2 pages = 4.0, class 4), 16 full 3-4
    (8 / 2 = 4.0, class 4), 20 full 5 and chunked 10 (4 / 2 = 2.0, class 2).
    Without free points E's unit would hold all six pages: 20 / 6 = 3.33,
    class 3 for every one of them.
    """
    kv = manager(full(4), chunked(4, 8))
    req, hit = compute(kv, "a", list(range(20)))
    assert hit == 0
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    kv.free(req)
    kv.check_integrity()
    assert sorted(b.block_id for b in list(kv.block_pool.policy)[:4]) == [6, 7, 8, 9]
    assert free_classes(kv) == {1: 4, 2: 4, 3: 4, 4: 4, 5: 2, 10: 2}


def test_a_free_point_lifts_what_a_shallower_chunk_caps_by_hand() -> None:
    """Values alone (``UnitValues``), blocks of 4, chunk 8: kept point 12 (not
    free: it needs the chunk from 8, one page) and free points 8 and 16, E = 16.

    Ratios: unit 8 = 8 tokens / 2 full pages = 4.0; unit 12 = 4 / (1 full +
    1 chunked) = 2.0; unit 16 = 4 / 1 = 4.0. Chains: 4.0, 2.0, 2.0 (a deeper
    unit is capped by a shallower one). A hit at 16 needs only full blocks,
    so the full blocks of units 12 and 16 are worth its 4.0; point 12's own
    chunked page keeps its chain value 2.0.
    """
    points = FinalPoints([12], 16, 0, 4, free_period=8)
    assert points.kept == [8, 12, 16]
    assert [p for p in points.points if points.is_free(p)] == [8, 16]
    values = UnitValues(points, {8: 2, 12: 1, 16: 1}, {12: 1})
    assert values.chain == {8: 4.0, 12: 2.0, 16: 2.0}
    assert [values.of_full(end) for end in (4, 8, 12, 16)] == [4.0, 4.0, 4.0, 4.0]
    assert values.of_full(20) is None
    assert values.of_other(12, shared=True) == 2.0


def test_free_points_stop_at_the_end() -> None:
    """Every multiple of the period from the period to ``E`` inclusive, and no
    further, whatever the step: blocks of 1 with a chunk of 1 make every
    position free (period 1), and a point past ``E`` would own blocks the
    request holds beyond what it cached."""
    assert FinalPoints([], 5, 0, 1, free_period=1).kept == [1, 2, 3, 4, 5]
    assert FinalPoints([3], 8, 0, 4, free_period=4).kept == [3, 4, 8]
    assert FinalPoints([], 7, 0, 1, free_period=4).kept == [4]
    assert FinalPoints([], 3, 0, 1, free_period=4).kept == []


def test_without_a_free_period_nothing_is_lifted() -> None:
    """The same points with ``free_period`` 0: 8 is no kept point, unit 12
    takes its full pages (12 / 4 = 3.0), unit 16 is capped by it."""
    points = FinalPoints([12], 16, 0, 4)
    assert points.kept == [12] and not points.is_free(16)
    values = UnitValues(points, {8: 2, 12: 1, 16: 1}, {12: 1})
    assert values.chain == {12: 3.0, 16: 3.0}
    assert [values.of_full(end) for end in (4, 8, 12, 16)] == [3.0, 3.0, 3.0, 3.0]


def test_a_free_point_hit_survives_its_chunks_by_hand() -> None:
    """Under pressure the dead chunks and E's unit go, the free point's full
    prefix stays. A 16-block pool (block 0 is the null block); ``a`` computes
    20 tokens (full 1-5, chunked 6-10) and is freed: the queue is the dead
    chunked 9-6, the never-used 11-15, E's unit (5, 10; class 2), then the
    free points' full blocks 4-1 (class 4). ``b``, 20 other tokens, needs ten
    blocks: full 9, 8, 7, 6, 11 and chunked 12, 13, 14, 15, 5. A third request
    that shares a's first 16 tokens still hits all 16 on full 1-4: the free
    point 16 reads no chunked block.
    """
    kv = manager(full(4), chunked(4, 8), num_blocks=16)
    a, _ = compute(kv, "a", list(range(20)))
    kv.free(a)
    queue = [b.block_id for b in kv.block_pool.policy]
    assert queue == [9, 8, 7, 6, 11, 12, 13, 14, 15, 5, 10, 4, 3, 2, 1]
    b, hit = compute(kv, "b", list(range(100, 120)))
    assert hit == 0
    assert kv.get_block_ids("b") == ([9, 8, 7, 6, 11], [12, 13, 14, 15, 5])
    kv.free(b)
    kv.check_integrity()
    c = Request("c", [*range(16), 500, 501, 502])
    blocks, hit = kv.get_computed_blocks(c)
    assert hit == 16
    assert blocks.get_block_ids() == ([1, 2, 3, 4], [0, 0, 0, 0])


def test_a_running_chunked_group_holds_only_its_current_chunk_by_hand() -> None:
    """Full attention and an 8-token chunk, blocks of 4, a 4-token tail: ``a``
    computes 18 tokens (full 1-5, chunked 6-10), then decodes one. The generic
    ``hybrid`` rule would hold what the last hit boundary below the tail needs
    (18 - 4 = 14, rounded down to 12: the chunk from 8, chunked 8-9); a chunked
    group holds only the chunk it is in, as under ``lru``: chunked 6-9 are
    released (evict first: no kept point needs them), 10 (tokens 16-17) stays.
    """
    kv = KVCacheManager(
        config(64, full(4), chunked(4, 8)), 256, cache_policy="hybrid", hybrid_tail_tokens=4
    )
    req, _ = compute(kv, "a", list(range(18)))
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    req.append_output_token_ids(500)  # the next step releases what 18 tokens skip
    assert kv.allocate_slots(req, 1) is not None
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5], [0, 0, 0, 0, 10])
    assert [b.block_id for b in kv.block_pool.policy][:4] == [6, 7, 8, 9]
    kv.check_integrity()
    kv.free(req)
    kv.check_integrity()
