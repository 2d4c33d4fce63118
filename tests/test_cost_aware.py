"""Cost-aware eviction (``hybrid``): worked examples with exact values and ids.

The policy ranks free blocks by ``released / pool + weight * class(value)``
(``hybridkv.policy.cost_aware``); the values come from the hit units of a freed
request (``hybridkv.policy.retention.UnitValues``).
"""

from __future__ import annotations

import pytest
from factories import admit, chunked, config, full, mamba, serve, swa

from hybridkv import (
    CostAwareEvictionPolicy,
    KVCacheManager,
    Request,
)
from hybridkv.cache_manager.admissions import admission_of
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.layouts import shipped_layout
from hybridkv.planning import plan_kv_cache
from hybridkv.policy.cost_aware import value_class
from hybridkv.policy.retention import (
    FinalPoints,
    UnitValues,
    floor_spacing,
    tail_tokens_saved,
)
from hybridkv.policy.tuning import DEFAULT_TUNING as T

FULL, SWA, MAMBA = full(4), swa(4, 8), mamba(4)

FLOOR_MAX_STATE_TOKENS = T.floor_max_state_tokens
FLOOR_MAX_WINDOW_TOKENS = T.floor_max_window_tokens


def released_policy(weight: float) -> tuple[CostAwareEvictionPolicy, list[KVCacheBlock]]:
    blocks = [KVCacheBlock(i) for i in range(1, 7)]
    policy = CostAwareEvictionPolicy(blocks, weight=weight)
    assert [b.block_id for b in policy.take(6)] == [1, 2, 3, 4, 5, 6]
    for b in blocks[:5]:
        b.block_hash = bytes([b.block_id])
    b1, b2, b3, b4, b5, b6 = blocks
    policy.release([b1, b2], value=4.0)  # class 4
    policy.release([b3], value=1.0)  # class 0
    policy.release([b4], value=16.0)  # class 8
    policy.release([b5], evict_first=True)
    policy.release([b6], value=2.0)  # hashless: to the head whatever its value
    policy.check_integrity()
    return policy, blocks


def test_value_classes_are_half_octaves() -> None:
    assert [value_class(v) for v in (1.0, 1.4, 1.5, 2.0, 3.0, 16.0, 0.5)] == [0, 0, 1, 2, 3, 8, -2]
    with pytest.raises(ValueError, match="value must be > 0"):
        value_class(0.0)


def test_keys_rank_recency_plus_weighted_class() -> None:
    policy, blocks = released_policy(weight=1.0)
    # keys: b1 1/6 + 2, b2 2/6 + 2, b3 3/6 + 0, b4 4/6 + 4; b6, b5 at the head.
    assert [b.evict_key for b in blocks[:4]] == pytest.approx(
        [1 / 6 + 2, 2 / 6 + 2, 0.5, 4 / 6 + 4]
    )
    assert [b.block_id for b in policy] == [6, 5, 3, 1, 2, 4]
    policy.remove(blocks[2])  # a hit on b3
    assert [b.block_id for b in policy.take(4)] == [6, 5, 1, 2]
    assert policy.num_free_blocks == 1
    policy.check_integrity()


def test_weight_zero_is_lru() -> None:
    policy, _ = released_policy(weight=0.0)
    assert [b.block_id for b in policy.take(6)] == [6, 5, 1, 2, 3, 4]


def test_bad_weight_and_overdraw() -> None:
    with pytest.raises(ValueError, match="weight must be >= 0"):
        CostAwareEvictionPolicy([], weight=-1.0)
    policy, _ = released_policy(weight=1.0)
    with pytest.raises(ValueError, match="asked for 7 blocks, 6 free"):
        policy.take(7)
    with pytest.raises(ValueError, match="hybrid_value_weight must be a finite number"):
        KVCacheManager(config(8, FULL, SWA), 64, cache_policy="hybrid", hybrid_value_weight=-1)


def test_tail_points_thin_evenly() -> None:
    # end 800, step 80: k = 1, 2, 3, 4, 8 steps below the end.
    saved = [tail_tokens_saved(800, 800 - 80 * k, 80) for k in (1, 2, 3, 4, 8)]
    assert saved == [80, 160, 80, 320, 640]


def test_unit_values_by_hand() -> None:
    # Kept point 160 (an admission hit), end 800, tail 320 (points 480 .. 800).
    points = FinalPoints([160], 800, 320, 80)
    full = {160: 2, 800: 8}
    extra = {160: 7, 800: 7, 720: 7, 640: 7, 560: 7, 480: 7}
    v = UnitValues(points, full, extra)
    assert v.main == [160, 800]
    # 160 / (2 + 7); E's own 640 / 15 is capped by the shallower unit.
    assert v.chain == pytest.approx({160: 160 / 9, 800: 160 / 9})
    assert v.of_full(80) == v.of_full(160) == pytest.approx(160 / 9)
    assert v.of_full(800) == pytest.approx(160 / 9)
    assert v.of_full(880) is None  # past E: no kept point needs it
    assert v.of_other(720, shared=False) == pytest.approx(80 / 7)
    assert v.of_other(640, shared=False) == pytest.approx(160 / 9)  # 160/7, capped
    assert v.of_other(720, shared=True) == pytest.approx(160 / 9)


def test_floor_spacing_by_hand() -> None:
    def groups(*specs):
        kv = KVCacheManager(config(64, *specs), 256, cache_policy="hybrid")
        return [(m.has_skips, m.block_size, m.first_needed_block) for m in kv.coordinator.managers]

    # Sliding window 8 at block size 4 holds 2 blocks per hit point; a full page
    # holds 4 tokens: 32 * 2 * 4 = 256. Mamba: one state: 32 * 1 * 4 = 128.
    assert floor_spacing(groups(FULL, SWA), 4) == 256
    assert floor_spacing(groups(FULL, MAMBA), 4) == 128
    assert floor_spacing(groups(SWA), 4) == 0  # no full attention: no floor
    # The cost-based spacing past FLOOR_MAX_STATE_TOKENS is capped with state
    # groups (one page a point each), rounded up to ``lcm``; not with a window.
    full_page = (False, 4, lambda p: 0)
    states = [full_page] + [(True, 4, lambda p: p // 4 - 1)] * 200  # 200 pages a point
    assert floor_spacing(states, 4) == FLOOR_MAX_STATE_TOKENS  # not 25,600
    assert floor_spacing(states, 48) == 17_952  # 374 x 48
    assert floor_spacing(states[:2], 4) == 128  # one state: below the cap, unchanged
    # A window's point needs the same 200 pages wherever it falls: 25,600, capped
    # at FLOOR_MAX_WINDOW_TOKENS; 190 pages (24,320) are below the cap.
    window = [full_page, (True, 4, lambda p: p // 4 - 200)]
    assert floor_spacing(window, 4) == FLOOR_MAX_WINDOW_TOKENS
    assert floor_spacing(window, 48) == 24_576  # 512 x 48
    assert floor_spacing(window, 40) == 24_600  # rounded up: 615 x 40
    assert floor_spacing([full_page, (True, 4, lambda p: p // 4 - 190)], 4) == 24_320
    # With a state group too, the state cap (the smaller) holds.
    assert floor_spacing([*window, states[1]], 4) == FLOOR_MAX_STATE_TOKENS
    # The ratio and both caps are the tuning's: the rule holds for any of them.
    tuning = T.replace(floor_ratio=8, floor_max_state_tokens=4_000, floor_max_window_tokens=6_000)
    assert floor_spacing(states, 4, tuning) == 4_000  # 8 x 200 x 4 = 6,400, capped
    assert floor_spacing(window, 4, tuning) == 6_000
    assert floor_spacing([*window, states[1]], 4, tuning) == 4_000
    varying = [full_page, (True, 4, lambda p: p // 4 - (100 if p % 8 else 300))]
    assert floor_spacing(varying, 4, tuning) == 6_400  # a chunk's: never capped
    # A chunk's pages vary with the point's place (here 100 or 300, mean 200):
    # the same 25,600, never capped.
    chunk = [full_page, (True, 4, lambda p: p // 4 - (100 if p % 8 else 300))]
    assert floor_spacing(chunk, 4) == 25_600
    # One page at the first place sampled is no state when other places need more.
    chunk = [full_page, (True, 4, lambda p: p // 4 - (1 if p % 8 == 0 else 399))]
    assert floor_spacing(chunk, 4) == 25_600
    kv = KVCacheManager(config(64, FULL, MAMBA), 512, cache_policy="hybrid")
    req = Request("a", list(range(300)))
    blocks, hit = kv.get_computed_blocks(req)
    assert kv.policy.kept_points(admission_of(req, hit, blocks)) == (
        128,
        256,
        300,
    )  # and the prompt's end


@pytest.mark.parametrize(
    ("num_chunked", "chunk", "spacing"),
    [
        # One chunked group, C = 4096: (p % 4096) // 16 is 0 .. 255 evenly over the
        # hit positions p (multiples of 16), mean 127.5 pages: 32 * 127.5 * 16.
        (1, 4096, 65_280),
        # Llama 4 Scout's groups (configs/llama-4-scout.yaml as the planner groups
        # it): 3 chunked groups of C = 8192 and 1 full group, block size 16.
        # Mean 255.5 pages per chunked group: 32 * 3 * 255.5 * 16.
        (3, 8192, 392_448),
        # C = 96: 6 blocks, mean 2.5 pages: 32 * 2.5 * 16. The 1024 samples are not
        # whole chunks: from 16 << 20 (block 4 of a chunk) the 4 left over fall on
        # blocks 4, 5, 0, 1, whose mean is the chunk's (from 16 << 19 or 16 << 21:
        # on blocks 2-5, mean 3.5, spacing 1296).
        (1, 96, 1280),
    ],
)
def test_floor_spacing_of_chunked_layouts_is_the_exact_mean(num_chunked, chunk, spacing) -> None:
    # A hit at p needs, in a chunked group, the blocks of p's chunk before p. The
    # spacing is FLOOR_RATIO (32) x the mean of those pages over the hit positions
    # far from the start, in full-attention tokens (one full page holds 16), rounded
    # up to the block size: exact here, since a chunk spans a power of two of blocks.
    specs = [chunked(16, chunk)] * num_chunked + [full(16)]
    kv = KVCacheManager(config(64, *specs), 1 << 20, cache_policy="hybrid")
    assert kv.policy.floor_tokens == spacing
    req = Request("a", list(range(2 * spacing + 1)))
    assert kv.policy.kept_points(admission_of(req, 0, None)) == (spacing, 2 * spacing)


@pytest.mark.parametrize(("weight", "a_hit", "b_hit"), [(3.0, 40, 0), (0.0, 0, 8)])
def test_a_valuable_old_unit_outlives_a_cheap_new_one(weight, a_hit, b_hit) -> None:
    # 15 usable blocks, no tail. A: 40 tokens = 10 full blocks + 1 state (at 40),
    # value 40 / 11 (class 3). B, later: 8 tokens = 2 full + 1 state, value 8 / 3
    # (class 2). C (12 new tokens) needs 3 full + 1 state: 1 never-used block,
    # then 3 evicted ones. Cost-aware evicts B's unit; recency alone A's deepest.
    kv = KVCacheManager(
        config(16, FULL, MAMBA),
        256,
        cache_policy="hybrid",
        hybrid_tail_tokens=0,
        hybrid_value_weight=weight,
    )
    a = list(range(40))
    b = list(range(100, 108))
    assert serve(kv, "a", a) == 0
    assert serve(kv, "b", b) == 0
    assert serve(kv, "c", list(range(200, 212))) == 0
    assert kv.get_computed_blocks(Request("a2", [*a, 1]))[1] == a_hit  # read-only probes
    assert kv.get_computed_blocks(Request("b2", [*b, 1]))[1] == b_hit


def test_auto_value_weight() -> None:
    from hybridkv import ChunkedLocalAttentionSpec
    from hybridkv.policy import auto_value_weight

    chunk = ChunkedLocalAttentionSpec(
        block_size=4, num_kv_heads=1, head_size=4, dtype="float32", attention_chunk_size=8
    )
    # By the costliest non-full kind: chunks, then Mamba states, then windows.
    tuning = T.replace(value_weight_chunked=5.0, value_weight_mamba=3.0, value_weight_sliding=0.5)
    assert auto_value_weight([FULL, SWA], tuning) == 0.5
    assert auto_value_weight([FULL, MAMBA], tuning) == 3.0
    assert auto_value_weight([FULL, SWA, chunk], tuning) == 5.0
    assert auto_value_weight([FULL, MAMBA, chunk], tuning) == 5.0
    assert auto_value_weight([FULL, MAMBA]) == T.value_weight_mamba  # the defaults' own
    kv = KVCacheManager(config(8, FULL, SWA), 64, cache_policy="hybrid", hybrid_tuning=tuning)
    assert kv.block_pool.policy.weight == 0.5
    kv = KVCacheManager(config(8, FULL, MAMBA), 64, cache_policy="hybrid", hybrid_tuning=tuning)
    assert kv.block_pool.policy.weight == 3.0
    kv = KVCacheManager(config(8, FULL, MAMBA), 64, cache_policy="hybrid", hybrid_value_weight=0.25)
    assert kv.block_pool.policy.weight == 0.25  # a weight given by hand wins


def test_two_classes_interleave_by_key() -> None:
    # Weight 0: keys are release order whatever the class; with two classes the
    # take must switch queues as soon as the other head's key is lower.
    blocks = [KVCacheBlock(i) for i in range(1, 5)]
    policy = CostAwareEvictionPolicy(blocks, weight=0.0)
    policy.take(4)
    for b in blocks:
        b.block_hash = bytes([b.block_id])
    b1, b2, b3, b4 = blocks
    policy.release([b1], value=1.0)  # class 0, key 1/4
    policy.release([b2], value=4.0)  # class 4, key 2/4
    policy.release([b3], value=1.0)  # class 0, key 3/4
    policy.release([b4], value=4.0)  # class 4, key 4/4
    assert [b.block_id for b in policy.take(3)] == [1, 2, 3]
    assert [b.block_id for b in policy.take(1)] == [4]


def test_ranks_by_value_only_with_a_weight() -> None:
    assert CostAwareEvictionPolicy([], weight=0.0).ranks_by_value is False
    assert CostAwareEvictionPolicy([], weight=0.5).ranks_by_value is True
    blocks = [KVCacheBlock(1)]
    from hybridkv.core.eviction import LRUEvictionPolicy

    assert LRUEvictionPolicy(blocks).ranks_by_value is False


@pytest.mark.parametrize("class_0_first", [True, False])
def test_equal_keys_evict_the_lower_value_class_first(class_0_first: bool) -> None:
    # Pool of 6, weight 1/3: key = clock / 6 + (1/3) * class / 2, so a class-1 block
    # (value 1.5) released one step before a class-0 block (value 1) has the same
    # key. On such a tie the lower class (less recompute saved per page) goes
    # first, whichever class queue was made first.
    blocks = [KVCacheBlock(i) for i in range(1, 7)]
    for b in blocks:
        b.block_hash = bytes([b.block_id])
    policy = CostAwareEvictionPolicy(blocks, weight=1 / 3)
    assert len(policy.take(6)) == 6
    b1, b2, b3 = blocks[:3]
    if class_0_first:
        policy.release([b3], value=1.0)  # clock 1, key 1/6: makes class 0 first
    policy.release([b1], value=1.5)  # class 1
    policy.release([b2], value=1.0)  # class 0, one step later: same key as b1
    assert b1.evict_key == b2.evict_key
    expected = [b3, b2, b1] if class_0_first else [b2, b1]
    assert list(policy)[-len(expected) :] == expected  # iteration follows take's order
    assert [policy.take(1)[0] for _ in expected] == expected  # one block at a time
    policy.check_integrity()


def test_an_explicit_eviction_policy_overrides_the_hybrid_ranking() -> None:
    # ``eviction_policy`` overrides the free set's ordering under either cache policy;
    # without it, ``hybrid`` on a layout with skips ranks by value (cost-aware).
    from hybridkv.core.eviction import LRUEvictionPolicy

    kv = KVCacheManager(
        config(8, FULL, SWA), 64, cache_policy="hybrid", eviction_policy=LRUEvictionPolicy
    )
    assert type(kv.block_pool.policy) is LRUEvictionPolicy
    kv = KVCacheManager(config(8, FULL, SWA), 64, cache_policy="hybrid")
    assert type(kv.block_pool.policy) is CostAwareEvictionPolicy
    # Recency alone wherever nothing is ranked: lru, no prefix caching, or no
    # group with skips (full attention only).
    for cfg, kwargs in [
        (config(8, FULL, SWA), {}),
        (config(8, FULL, SWA), {"cache_policy": "hybrid", "enable_caching": False}),
        (config(8, FULL, full(8)), {"cache_policy": "hybrid"}),
    ]:
        assert type(KVCacheManager(cfg, 64, **kwargs).block_pool.policy) is LRUEvictionPolicy


def test_hybrid_with_an_lru_queue_puts_dead_blocks_at_the_head() -> None:
    """``hybrid`` over an explicit LRU queue: sliding blocks no kept point needs
    (a 24-token request, window 8 on blocks of 4: E = 24 needs entries 4-5) are
    released evict-first, ahead of the never-used blocks; the rest go to the
    tail in release order."""
    from hybridkv.core.eviction import LRUEvictionPolicy

    kv = KVCacheManager(
        config(16, FULL, SWA),
        64,
        cache_policy="hybrid",
        hybrid_tail_tokens=0,
        eviction_policy=LRUEvictionPolicy,
    )
    a = Request("a", list(range(24)))
    _, new = admit(kv, a)
    assert new.get_block_ids() == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    kv.free(a)
    kv.check_integrity()
    queue = [b.block_id for b in kv.block_pool.policy]
    assert queue[:4] == [10, 9, 8, 7] and queue[4:7] == [13, 14, 15]
    assert queue[7:] == [6, 12, 5, 11, 4, 3, 2, 1]


def test_a_release_mixing_hashless_and_keyed_blocks_keys_each_keyed_one() -> None:
    blocks = [KVCacheBlock(i) for i in range(1, 5)]
    policy = CostAwareEvictionPolicy(blocks, weight=1.0)
    b1, b2, b3, b4 = policy.take(4)
    b1.block_hash, b3.block_hash, b4.block_hash = b"1", b"3", b"4"
    policy.release([b1, b2, b3], value=4.0)  # b2 hashless: to the head, unkeyed
    # keys: clock / span + weight * class / 2 = k / 4 + 2 for the k-th keyed block
    assert [b1.evict_key, b3.evict_key] == pytest.approx([1 / 4 + 2, 2 / 4 + 2])
    policy.release([b4], value=4.0)  # the clock went on from 2
    assert b4.evict_key == pytest.approx(3 / 4 + 2)
    assert [b.block_id for b in policy] == [2, 1, 3, 4]
    policy.check_integrity()


@pytest.mark.parametrize(
    ("layout", "spacing"),
    [
        ("bamba-9b", 17_952),  # cost-based 168,960, capped (528-token blocks: 34 x 528)
        ("granite-4.0-h-tiny", 18_000),  # 115,200, capped (400-token blocks)
        ("jamba-v0.1", 17_920),  # cost-based, the cap's own value
        ("gemma-3-27b", 24_576),  # cost-based 196,608, capped (windows)
        ("gemma-3-12b", 24_576),  # 163,840, capped
        ("gpt-oss-120b", 4_096),  # windows of 128 tokens: below the cap
        ("llama-4-scout", 392_448),  # chunked: never capped (its chunk starts are free)
    ],
)
def test_shipped_floor_spacings(layout: str, spacing: int) -> None:
    plan = plan_kv_cache(
        shipped_layout(layout), 80 * 10**9, max_num_batched_tokens=8192, max_model_len=131_072
    )
    kv = KVCacheManager(plan.kv_cache_config, 131_072, cache_policy="hybrid")
    assert kv.policy.floor_tokens == spacing


def test_a_floor_set_by_hand() -> None:
    # Full + Mamba, block size 4: the cost-based floor is 128 tokens (above). A
    # floor set by hand is rounded up to the hit step; 0 keeps no floor; lru has none.
    def kept(**knobs):
        kv = KVCacheManager(config(64, FULL, MAMBA), 512, cache_policy="hybrid", **knobs)
        req = Request("a", list(range(300)))
        blocks, hit = kv.get_computed_blocks(req)
        return kv.policy.floor_tokens, kv.policy.kept_points(admission_of(req, hit, blocks))

    assert kept() == (128, (128, 256, 300))
    assert kept(hybrid_floor_tokens=90) == (92, (92, 184, 276, 300))
    assert kept(hybrid_floor_tokens=0) == (0, (300,))
    lru = KVCacheManager(config(64, FULL, MAMBA), 512, hybrid_floor_tokens=90)
    assert not lru.policy.keeps_points  # the hybrid knobs change nothing under lru
    for bad in (-4, 1.5, True, "8"):
        with pytest.raises(ValueError, match=r"^hybrid_floor_tokens must be None \(by cost\)"):
            KVCacheManager(config(64, FULL, MAMBA), 512, hybrid_floor_tokens=bad)


@pytest.mark.parametrize("evict_first", [False, True])
@pytest.mark.parametrize("value", [None, 3.0])
def test_free_held_blocks_is_free_blocks_of_blocks_held_once(
    evict_first: bool, value: float | None
) -> None:
    """``BlockPool.free_held_blocks`` (a cache policy's runs of blocks only the
    freed request holds) leaves the pool exactly as ``free_blocks`` does."""
    pools = [BlockPool(9, 1, eviction_policy=CostAwareEvictionPolicy) for _ in range(2)]
    for pool, free in zip(pools, ("free_blocks", "free_held_blocks"), strict=True):
        blocks = pool.get_new_blocks(6)
        pool.cache_run(blocks, [bytes([i]) for i in range(6)], 0, list(range(6)), 1, 0, 5)
        pool.free_blocks(blocks[:2], value=2.0)  # an earlier release to rank against
        getattr(pool, free)(blocks[2:][::-1], evict_first=evict_first, value=value)
        assert all(b.ref_cnt == 0 for b in blocks)
        pool.check_integrity()
    a, b = ([(x.block_id, x.free_class, x.evict_key) for x in p.policy] for p in pools)
    assert a == b and len(a) == 8
