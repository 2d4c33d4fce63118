"""Bad input is a ValueError naming the field; out of blocks is None, never an error."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from factories import (
    admit,
    config,
    free_ids,
    full,
    mamba,
    manager,
    prefill,
    ref_counts,
    req,
    swa,
    toks,
)

from hybridkv import KVCacheBlocks, KVCacheManager, KVCacheSpec, Request


# -- allocate_slots arguments ----------------------------------------------------------------
@pytest.mark.parametrize("n", [0, -1, True, 2.0])
def test_num_new_tokens_must_be_a_positive_int(n: object) -> None:
    kv = manager(8, full(4))
    r = req("r", 4)
    with pytest.raises(ValueError, match="num_new_tokens"):
        kv.allocate_slots(r, n)  # type: ignore[arg-type]
    assert kv.get_block_ids("r") == ([],) and free_ids(kv) == list(range(1, 8))


def test_negative_computed_or_lookahead_tokens() -> None:
    kv = manager(8, full(4))
    with pytest.raises(ValueError, match="num_new_computed_tokens"):
        kv.allocate_slots(req("r", 4), 4, num_new_computed_tokens=-1)
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        kv.allocate_slots(req("r", 4), 4, num_lookahead_tokens=-1)


def test_request_longer_than_max_model_len() -> None:
    kv = manager(16, full(4), max_model_len=16)
    long = req("long", 17)
    with pytest.raises(ValueError, match="max_model_len"):
        kv.get_computed_blocks(long)
    with pytest.raises(ValueError, match="max_model_len"):
        kv.allocate_slots(long, 17)
    # Even a step that stays within max_model_len: the request itself is too long.
    with pytest.raises(ValueError, match="'long' has 17 tokens, more than max_model_len=16"):
        kv.allocate_slots(long, 8)
    r = req("r", 10)
    with pytest.raises(ValueError, match="max_model_len"):
        kv.allocate_slots(r, 20)  # 0 + 20 computed > 16
    prefill(kv, r)
    r.append_output_token_ids(list(range(6)))  # 16 tokens: still fine
    assert kv.allocate_slots(r, 6) is not None
    r.num_computed_tokens = 16
    r.append_output_token_ids(7)  # 17 tokens
    with pytest.raises(ValueError, match="max_model_len"):
        kv.allocate_slots(r, 1)
    assert kv.get_block_ids("r") == ([1, 2, 3, 4],)
    kv.check_integrity()


def test_bad_manager_arguments() -> None:
    cfg = config(8, full(4))
    with pytest.raises(ValueError, match="max_model_len"):
        KVCacheManager(cfg, 0)
    with pytest.raises(ValueError, match="hash_algo"):
        KVCacheManager(cfg, 64, hash_algo="blake3")
    with pytest.raises(ValueError, match="hash_algo"):  # even with caching off
        KVCacheManager(cfg, 64, hash_algo="blake3", enable_caching=False)
    with pytest.raises(ValueError, match="kv_cache_config"):
        KVCacheManager({"num_blocks": 8}, 64)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request"):
        KVCacheManager(cfg, 64).allocate_slots("r", 4)  # type: ignore[arg-type]


# -- requests ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt_token_ids": []}, "prompt_token_ids"),
        ({"request_id": ""}, "request_id"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"lora_name": 3}, "lora_name"),
        ({"mm_inputs": [("img", 0)]}, r"mm_inputs\[0\]"),
        ({"mm_inputs": ["img"]}, r"mm_inputs\[0\]"),
        ({"mm_inputs": [("img", 0, 2), ("", 2, 2)]}, r"mm_inputs\[1\]\.content_hash"),
        ({"mm_inputs": [(7, 0, 2)]}, "content_hash"),
        ({"mm_inputs": [("img", -1, 2)]}, "offset"),
        ({"mm_inputs": [("img", True, 2)]}, "offset"),
        ({"mm_inputs": [("img", 0, 0)]}, "length"),
        ({"mm_inputs": [("img", 6, 3)]}, r"mm_inputs\[0\] covers tokens \[6, 9\)"),
    ],
)
def test_bad_request_fields(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"request_id": "r", "prompt_token_ids": toks(8)}
    args.update(kwargs)
    rid, tokens = args.pop("request_id"), args.pop("prompt_token_ids")
    with pytest.raises(ValueError, match=field):
        Request(rid, tokens, **args)  # type: ignore[arg-type]


# -- prefix hits handed back to allocate_slots ---------------------------------------------------
def _cached_prefix_and_hit(kv: KVCacheManager) -> tuple[Request, KVCacheBlocks]:
    """A caches [1, 2] and finishes; B (A's 8 tokens + 1) looks up a hit of 8."""
    a = req("a", 8)
    admit(kv, a)
    kv.free(a)  # queue: [3, 4, 2, 1]
    b = req("b", 9)
    blocks, n = kv.get_computed_blocks(b)
    assert (blocks.get_block_ids(), n) == (([1, 2],), 8)
    return b, blocks


def test_stale_hit_after_eviction_is_rejected_and_changes_nothing() -> None:
    kv = manager(5, full(4))  # blocks 1..4
    b, blocks = _cached_prefix_and_hit(kv)
    prefill(kv, req("c", toks(12, start=500)))  # pops 3, 4, 2: evicts A's 2nd block
    assert free_ids(kv) == [1]
    before = ref_counts(kv)
    with pytest.raises(ValueError, match="stale"):
        kv.allocate_slots(b, 1, 8, blocks)
    assert ref_counts(kv) == before and free_ids(kv) == [1]
    assert kv.get_block_ids("b") == ([],)
    kv.check_integrity()


def test_stale_hit_after_an_eviction_with_events_is_rejected() -> None:
    """With events on, eviction takes the general path (it emits BlockRemoved):
    it too makes an earlier hit stale."""
    kv = manager(5, full(4), enable_kv_cache_events=True)
    b, blocks = _cached_prefix_and_hit(kv)
    prefill(kv, req("c", toks(12, start=500)))  # evicts A's 2nd block
    with pytest.raises(ValueError, match="stale"):
        kv.allocate_slots(b, 1, 8, blocks)
    kv.check_integrity()


def test_stale_hit_after_its_blocks_are_uncached_is_rejected() -> None:
    """A holds its blocks; B finds them as a hit; A's step then fails and its
    uncomputed blocks leave the cache: B's hit is stale."""
    kv = manager(6, full(4))
    a = req("a", 8)
    assert kv.allocate_slots(a, 8) is not None  # blocks 1, 2 cached, not computed
    b = req("b", 9)
    blocks, n = kv.get_computed_blocks(b)
    assert (blocks.get_block_ids(), n) == (([1, 2],), 8)
    assert kv.uncache_uncomputed(a) == 2
    with pytest.raises(ValueError, match="stale"):
        kv.allocate_slots(b, 1, 8, blocks)
    kv.check_integrity()


def test_stale_hit_after_reset_is_rejected() -> None:
    kv = manager(5, full(4))
    b, blocks = _cached_prefix_and_hit(kv)
    assert kv.reset_prefix_cache()
    with pytest.raises(ValueError, match="stale"):
        kv.allocate_slots(b, 1, 8, blocks)
    assert free_ids(kv) == [3, 4, 2, 1]
    kv.check_integrity()


def test_hit_blocks_of_another_request_are_rejected() -> None:
    kv = manager(8, full(4))
    _, blocks = _cached_prefix_and_hit(kv)
    other = req("o", toks(9, start=500))
    with pytest.raises(ValueError, match="stale"):
        kv.allocate_slots(other, 1, 8, blocks)


def test_inconsistent_hit_arguments() -> None:
    kv = manager(8, full(4))
    b, blocks = _cached_prefix_and_hit(kv)
    with pytest.raises(ValueError, match="new_computed_blocks"):
        kv.allocate_slots(b, 1, 8, None)  # tokens without blocks
    with pytest.raises(ValueError, match="num_new_computed_tokens=4"):
        kv.allocate_slots(b, 5, 4, blocks)  # 2 blocks cover 8, not 4
    with pytest.raises(ValueError, match="num_new_computed_tokens=0"):
        kv.allocate_slots(b, 9, 0, blocks)  # blocks without tokens: cover 8, not 0
    with pytest.raises(ValueError, match="groups"):
        kv.allocate_slots(b, 1, 8, KVCacheBlocks((*blocks.blocks, [])))
    with pytest.raises(ValueError, match="num_new_computed_tokens"):
        kv.allocate_slots(req("short", 8), 1, 8, blocks)  # the hit is the whole prompt
    assert kv.allocate_slots(b, 1, 8, blocks) is not None  # the valid call still works
    b.num_computed_tokens = 9
    with pytest.raises(ValueError, match="already has"):
        kv.allocate_slots(b, 1, 8, blocks)  # hits apply to new requests only
    kv.check_integrity()


@pytest.mark.parametrize("has", ["computed tokens", "blocks"])
def test_hits_apply_only_to_a_request_without_progress_or_blocks(has: str) -> None:
    """Either alone refuses a hit: computed tokens (and no blocks yet), or blocks
    (and no computed tokens yet: its first step is still pending)."""
    kv = manager(8, full(4))
    b, blocks = _cached_prefix_and_hit(kv)
    if has == "computed tokens":
        b.num_computed_tokens = 4
    else:
        assert kv.allocate_slots(b, 1, 8, blocks) is not None  # b now holds blocks
    with pytest.raises(ValueError, match="already has computed tokens or blocks"):
        kv.allocate_slots(b, 1, 8, blocks)
    kv.check_integrity()


def test_hits_need_prefix_caching() -> None:
    kv = manager(8, full(4), enable_caching=False)
    r = req("r", 9)
    blocks, n = kv.get_computed_blocks(r)
    assert (blocks.get_block_ids(), n) == (([],), 0)
    fake = KVCacheBlocks(([kv.block_pool.blocks[1], kv.block_pool.blocks[2]],))
    with pytest.raises(ValueError, match="prefix caching"):
        kv.allocate_slots(r, 1, 8, fake)


# -- spec / config mismatch ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _UnknownSpec(KVCacheSpec):
    @property
    def kind(self) -> str:
        return "unknown"


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_spec_without_a_manager(policy: str) -> None:
    # Under ``hybrid`` the eviction policy is chosen first (by the groups' skips):
    # an unknown spec must still be the same ValueError, not a crash there.
    with pytest.raises(ValueError, match="no manager for _UnknownSpec"):
        manager(8, full(4), _UnknownSpec(4), cache_policy=policy)
    with pytest.raises(ValueError, match="no manager for _UnknownSpec"):
        manager(8, _UnknownSpec(4), full(4), cache_policy=policy)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "16", None])
def test_bad_hybrid_tail_tokens_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match="hybrid_tail_tokens must be an int >= 0"):
        manager(8, full(4), cache_policy="hybrid", hybrid_tail_tokens=bad)


@pytest.mark.parametrize("bad", [-1, -0.5, float("inf"), float("nan"), True, "2"])
def test_bad_hybrid_value_weight_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match="hybrid_value_weight must be a finite number >= 0"):
        manager(8, full(4), cache_policy="hybrid", hybrid_value_weight=bad)


def test_request_hashed_for_another_block_size() -> None:
    r = req("r", 9)
    manager(8, full(4)).get_computed_blocks(r)
    with pytest.raises(ValueError, match="already hashed"):
        manager(8, full(8)).get_computed_blocks(r)


# -- out of blocks ------------------------------------------------------------------------------
def test_out_of_blocks_is_none_never_an_exception() -> None:
    kv = manager(4, full(4), swa(4, 8))  # 3 usable blocks
    r = req("r", 8)  # 2 blocks per group = 4
    assert kv.allocate_slots(r, 8) is None
    assert kv.allocate_slots(r, 8) is None  # and again: nothing half-done
    assert free_ids(kv) == [1, 2, 3] and kv.get_block_ids("r") == ([], [])
    small = req("s", 4)
    assert kv.allocate_slots(small, 4) is not None  # 1 + 1
    assert kv.allocate_slots(small, 4, num_lookahead_tokens=4) is None  # would need 2 more
    assert kv.get_block_ids("s") == ([1], [2])
    kv.check_integrity()


@pytest.mark.parametrize("num_blocks", [10, 11])
def test_out_of_blocks_is_all_or_nothing_across_groups(num_blocks: int) -> None:
    # g0, g1 full; g2 sliding W=5. A 12-token prefill takes 9 blocks.
    kv = manager(num_blocks, full(4), full(4), swa(4, 5))
    a = req("a", 12)
    prefill(kv, a)
    tables, refs, queue = kv.get_block_ids("a"), ref_counts(kv), free_ids(kv)
    # Token 12: three new blocks, and g2 releases two (its window reads from 8).
    a.append_output_token_ids(112)
    new = kv.allocate_slots(a, 1)
    if num_blocks == 10:  # nothing free: net need 1 > 0
        assert new is None
        assert (kv.get_block_ids("a"), ref_counts(kv), free_ids(kv)) == (tables, refs, queue)
    else:  # block 10 free: queue [10, 8, 7] after the release -> exactly enough
        assert new is not None and new.get_block_ids() == ([10], [8], [7])
        assert kv.get_block_ids("a") == ([1, 2, 3, 10], [4, 5, 6, 8], [0, 0, 9, 7])
    kv.check_integrity()


def test_single_usable_block() -> None:
    # Pool of 2: only block 1. Full attention cannot hold 5 tokens...
    assert manager(2, full(4)).allocate_slots(req("r", 5), 5) is None
    # ...but Mamba without caching keeps one state block for any length.
    kv = manager(2, mamba(4), enable_caching=False)
    r = req("r", 100)
    prefill(kv, r)
    assert kv.get_block_ids("r") == ([0] * 24 + [1],)
