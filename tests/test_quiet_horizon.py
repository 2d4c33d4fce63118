"""The quiet horizon: decode steps that provably change nothing skip the groups.

``KVCacheManager.allocate_slots`` answers a step inside a request's quiet
horizon (``KVCacheCoordinator.quiet_horizon``) without visiting any group. The
horizon must never reach past a step that would allocate, release or cache:
checked here against a manager whose fast path is off, block for block, and
each bound against a brute-force search of the rule it stands for.
"""

from __future__ import annotations

import random

import pytest
from factories import chunked, decode, free_ids, full, mamba, manager, prefill, ref_counts, req, swa

from hybridkv import KVCacheManager
from hybridkv.cache_manager.quiet import GENERAL
from hybridkv.managers.base import NEVER, RequestBlockState, SingleTypeKVCacheManager

LAYOUTS = {
    "sliding": (full(4), swa(4, 7)),
    "chunked": (full(4), chunked(4, 8)),
    "mamba": (full(4), mamba(4)),
    "two-sizes": (full(2), swa(6, 10), mamba(6)),
}


def test_worked_example_sliding_window_lru() -> None:
    """Block size 4, window 8, 10 tokens computed: 3 blocks cover 12 slots, the
    first sliding block goes once 11 are computed (skipped(11) = 4), the third
    block is cached when 12 tokens are."""
    kv = manager(20, full(4), swa(4, 8))
    r = req("r", 10)
    prefill(kv, r)
    assert kv._quiet.horizons["r"] == (12, 11, 12)
    calls = []
    real = kv.coordinator.allocate
    kv.coordinator.allocate = lambda *a, **k: calls.append(a[1]) or real(*a, **k)  # type: ignore[method-assign]
    real_extend = kv.coordinator.extend
    kv.coordinator.extend = lambda *a: (
        calls.append((a[0].num_computed_tokens + a[1], a[2])) or real_extend(*a)
    )  # type: ignore[method-assign]
    decode(kv, r, 1)  # 11 slots, 10 computed: inside the horizon
    assert calls == [] and kv.get_block_ids("r")[1][0] != 0
    decode(kv, r, 2)  # 11 computed: sliding block 0 is released (extend, releases)
    assert calls == [(12, True)] and kv.get_block_ids("r")[1][0] == 0
    assert kv._quiet.horizons["r"] == (12, 15, 16)  # 12 tokens cached: block 2 is full
    kv.check_integrity()
    assert kv.free(r) and "r" not in kv._quiet.horizons


def _state(kv: KVCacheManager, rids: list[str]) -> tuple:
    pool = kv.block_pool
    cached = sorted((b.block_id, b.block_hash, b.group_id) for b in pool.blocks if b.block_hash)
    return tuple(kv.get_block_ids(r) for r in rids), free_ids(kv), ref_counts(kv), cached


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fast_path_decides_exactly_as_the_full_path(layout: str, policy: str) -> None:
    specs = LAYOUTS[layout]
    fast = manager(48, *specs, max_model_len=96, cache_policy=policy)
    slow = manager(48, *specs, max_model_len=96, cache_policy=policy)
    slow._quiet.kind = lambda request, n: GENERAL  # type: ignore[method-assign]
    slow_calls = fast_calls = 0
    for kv in (fast, slow):
        real = kv.coordinator.allocate

        def counted(*a: object, _kv: KVCacheManager = kv, _real=real, **k: object):  # type: ignore[no-untyped-def]
            nonlocal fast_calls, slow_calls
            if _kv is fast:
                fast_calls += 1
            else:
                slow_calls += 1
            return _real(*a, **k)

        kv.coordinator.allocate = counted  # type: ignore[method-assign]
    calm: list[int] = []  # live plain steps past the horizon (``QuietHorizons.step``)
    real_extend = fast.coordinator.extend
    fast.coordinator.extend = lambda *a: calm.append(1) or real_extend(*a)  # type: ignore[method-assign]
    rng = random.Random(f"{layout}/{policy}")
    reqs: dict[str, tuple] = {}
    prefixes = [[rng.randrange(1000) for _ in range(40)] for _ in range(3)]
    for step in range(600):
        roll = rng.random()
        if roll < 0.15 or not reqs:
            rid = f"r{step}"
            p = [*rng.choice(prefixes)[: rng.randrange(1, 40)], rng.randrange(1000)]
            pair = (req(rid, p), req(rid, p))
            take = rng.randrange(1, 12)
            got = []
            for kv, r in zip((fast, slow), pair, strict=True):
                hit, n = kv.get_computed_blocks(r)
                m = max(1, min(take, r.num_tokens - n))
                new = kv.allocate_slots(r, m, n, hit)
                if new is not None:
                    r.num_computed_tokens = n + m
                got.append(None if new is None else new.get_block_ids())
            assert got[0] == got[1], f"step {step}: admission differs"
            if got[0] is None:
                for kv in (fast, slow):
                    kv.free(rid)
            else:
                reqs[rid] = pair
        elif roll < 0.85:
            rid = rng.choice(sorted(reqs))
            lookahead = 2 if rng.random() < 0.05 else 0
            pick = rng.choice([1, 1, 1, 5])
            got = []
            for kv, r in zip((fast, slow), reqs[rid], strict=True):
                if r.num_computed_tokens >= r.num_tokens:
                    r.append_output_token_ids(2000 + step)
                n = min(r.num_tokens - r.num_computed_tokens, pick)
                if r.num_computed_tokens + n + lookahead > 96:
                    got.append("full")
                    continue
                new = kv.allocate_slots(r, n, num_lookahead_tokens=lookahead)
                if new is not None:
                    r.num_computed_tokens += n
                got.append(None if new is None else new.get_block_ids())
            assert got[0] == got[1], f"step {step}: allocation differs"
            if got[0] in (None, "full"):
                for kv in (fast, slow):
                    kv.free(rid)
                del reqs[rid]
        else:
            rid = rng.choice(sorted(reqs))
            for kv in (fast, slow):
                kv.free(rid)
            del reqs[rid]
        assert _state(fast, sorted(reqs)) == _state(slow, sorted(reqs)), f"step {step}"
        if step % 50 == 0:
            fast.check_integrity()
    fast.check_integrity()
    assert slow_calls - fast_calls >= 10, (fast_calls, slow_calls)  # the fast path was taken
    assert len(calm) >= 10, len(calm)  # and the calm one


def _brute_release_at(m: SingleTypeKVCacheManager, st: RequestBlockState, limit: int) -> int:
    for x in range(limit):
        if m.release_stop(st, x) > st.num_skipped:
            return x
    return NEVER


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_next_release_at_is_the_first_length_that_releases(layout: str, hybrid: bool) -> None:
    kv = manager(8, *LAYOUTS[layout], cache_policy="hybrid" if hybrid else "lru")
    for m in kv.coordinator.managers:
        for skipped in range(6):
            st = RequestBlockState([kv.block_pool.null_block] * 40, 0, skipped)
            want = _brute_release_at(m, st, 4000) if m.has_skips else NEVER
            assert m.next_release_at(st) == want, (type(m).__name__, skipped)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_min_tokens_skipping_is_exact_per_kind_and_a_lower_bound_by_default(layout: str) -> None:
    kv = manager(8, *LAYOUTS[layout])
    for m in kv.coordinator.managers:
        if not m.has_skips:
            continue
        for s in range(1, 60):
            exact = next(n for n in range(s, 400) if m.get_num_skipped_tokens(n) >= s)
            assert m.min_tokens_skipping(s) == exact, (type(m).__name__, s)
            assert SingleTypeKVCacheManager.min_tokens_skipping(m, s) == s <= exact


def test_a_step_inside_the_horizon_still_refuses_bad_calls() -> None:
    """The fast path answers only what the full path would: a hit passed for a
    live request, or a request grown past max_model_len, still fail."""
    kv = manager(20, full(4), swa(4, 8), max_model_len=16)
    r = req("r", 10)
    prefill(kv, r)
    assert kv._quiet.horizons["r"][0] == 12  # 11 tokens would be inside the horizon
    hit, _ = kv.get_computed_blocks(req("other", 10))
    assert any(hit.blocks)
    with pytest.raises(ValueError, match=r"prefix hits .* apply only to a new or preempted"):
        kv.allocate_slots(r, 1, 0, hit)
    with pytest.raises(ValueError, match="num_new_computed_tokens"):
        kv.allocate_slots(r, 1, 4)  # hit tokens without their blocks
    r.append_output_token_ids(list(range(7)))  # 17 tokens > max_model_len 16
    with pytest.raises(ValueError, match="max_model_len"):
        kv.allocate_slots(r, 1)
    kv.check_integrity()
