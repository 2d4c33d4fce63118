"""KV events track cache keys, not blocks: duplicates are silent (worked examples).

One full-attention group, block size 4; a pool of N blocks hands out 1..N-1.
``prefill`` computes a prompt without a prefix lookup, so a second request
with the same tokens caches duplicate blocks under the same keys.
"""

from __future__ import annotations

from factories import free_ids, full, manager, prefill, req, toks

from hybridkv import BlockRemoved, BlockStored
from hybridkv.core.events import consecutive_runs


def test_a_duplicates_arrival_and_eviction_are_silent() -> None:
    kv = manager(10, full(4), enable_kv_cache_events=True)  # blocks 1..9
    a, b = req("a", 8), req("b", 8)  # same tokens 100..107
    prefill(kv, a)
    h = a.block_hashes
    assert kv.take_events() == [BlockStored([h[0], h[1]], None, toks(8), 4, None, 0)]
    prefill(kv, b)  # blocks 3, 4: duplicates of keys h0, h1
    assert kv.get_block_ids("b") == ([3, 4],) and kv.block_pool.num_cached_blocks() == 4
    assert kv.take_events() == []
    kv.free(a)
    kv.free(b)
    assert free_ids(kv) == [5, 6, 7, 8, 9, 2, 1, 4, 3]
    # C takes 7 blocks: 5..9 and A's 2, 1. B's copies stay cached: no BlockRemoved.
    prefill(kv, req("c", toks(28, start=500)))
    events = kv.take_events()
    assert [type(e) for e in events] == [BlockStored]
    assert kv.block_pool.cached_keys() == {
        (0, h[0]),
        (0, h[1]),
        *((0, x) for x in events[0].block_hashes),
    }
    # D takes 4 then 3: the keys' last blocks go, so now they are removed.
    prefill(kv, req("d", toks(8, start=900)))
    events = kv.take_events()
    assert events[:2] == [BlockRemoved([h[1]], 0), BlockRemoved([h[0]], 0)]
    assert [type(e) for e in events[2:]] == [BlockStored]
    kv.check_integrity()


def test_a_stored_run_starts_after_the_duplicates_and_names_its_parent() -> None:
    kv = manager(10, full(4), enable_kv_cache_events=True)
    a = req("a", 8)
    prefill(kv, a)
    kv.take_events()
    b = req("b", 16)  # A's 8 tokens, then 8 more: blocks 0, 1 duplicate, 2, 3 new
    prefill(kv, b)
    h = b.block_hashes
    assert h[:2] == a.block_hashes
    assert kv.take_events() == [BlockStored([h[2], h[3]], h[1], toks(16)[8:], 4, None, 0)]


def test_consecutive_runs() -> None:
    assert consecutive_runs([]) == []
    assert consecutive_runs([4]) == [(4, 5)]
    assert consecutive_runs([0, 1, 2, 5, 6, 9]) == [(0, 3), (5, 7), (9, 10)]
    assert consecutive_runs([3, 5, 7]) == [(3, 4), (5, 6), (7, 8)]


def test_uncaching_a_failed_steps_blocks_removes_only_keys_that_leave() -> None:
    kv = manager(10, full(4), enable_kv_cache_events=True)
    a, b = req("a", 8), req("b", 8)
    prefill(kv, a)
    prefill(kv, b)  # duplicates of A's two keys
    h = a.block_hashes
    kv.take_events()
    b.num_computed_tokens = 0  # B's step failed: none of its blocks were written
    assert kv.uncache_uncomputed(b) == 2
    assert kv.take_events() == []  # A still holds both keys
    a.num_computed_tokens = 4  # A's second block was not written either
    assert kv.uncache_uncomputed(a) == 1
    assert kv.take_events() == [BlockRemoved([h[1]], 0)]
    assert kv.block_pool.cached_keys() == {(0, h[0])}
    kv.check_integrity()
