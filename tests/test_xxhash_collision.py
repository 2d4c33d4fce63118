"""With the fast non-cryptographic hash, a hit must never return a block whose
stored token ids differ from the request's (the stored-token check).

A real xxh3-128 collision cannot be produced in a test, so each test simulates
one: a cached block's recorded tokens are changed, or a block is entered into
the index under a request's hash with other tokens.
"""

from __future__ import annotations

import pytest
from factories import admit, free_ids, full, hit_ids, hit_len, manager, prefill, req, swa

from hybridkv import KVCacheManager


def _pool_block(kv: KVCacheManager, block_id: int):  # type: ignore[no-untyped-def]
    return kv.block_pool.blocks[block_id]


def test_collided_block_is_refused() -> None:
    kv = manager(10, full(4), hash_algo="xxhash")
    a = req("a", 8)
    admit(kv, a)  # [1, 2] cached
    kv.free(a)
    assert hit_ids(kv, req("b", 9)) == ([1, 2],)  # genuine hit
    # Block 2 now "holds" other tokens under A's second hash: only block 1 hits.
    _pool_block(kv, 2).token_ids = [9, 9, 9, 9]
    assert hit_ids(kv, req("c", 9)) == ([1],)
    # Block 1 too: no hit at all (the scan stops at the first refusal).
    _pool_block(kv, 1).token_ids = [100, 101, 102, 7]
    assert hit_len(kv, req("d", 9)) == 0
    kv.check_integrity()


def test_block_inserted_under_a_foreign_hash_is_refused_and_duplicate_used() -> None:
    kv = manager(10, full(4), hash_algo="xxhash")
    b = req("b", 9)
    kv.get_computed_blocks(b)  # binds the hasher: b.block_hashes are known
    h0 = b.block_hashes[0]
    # Another tenant's block 5 lands under the same hash with tokens 1-4.
    kv.block_pool.cache_run([_pool_block(kv, 5)], [h0], 0, [1, 2, 3, 4], 4, 0, 1)
    assert kv.block_pool.cached[0][h0] is _pool_block(kv, 5)
    kv.check_integrity()
    assert hit_len(kv, b) == 0
    # A computes the real tokens (no lookup): its block 1 becomes a duplicate
    # of the same key, and the lookup falls through to it.
    a = req("a", 8)
    prefill(kv, a)
    assert kv.get_block_ids("a") == ([1, 2],)
    assert kv.block_pool.cached[0][h0] is _pool_block(kv, 5)  # still the primary
    blocks, n = kv.get_computed_blocks(b)
    assert (blocks.get_block_ids(), n) == (([1, 2],), 8)
    kv.check_integrity()


def test_adopting_a_hit_after_a_collision_check() -> None:
    kv = manager(6, full(4), hash_algo="xxhash")
    a = req("a", 8)
    admit(kv, a)
    kv.free(a)
    assert free_ids(kv) == [3, 4, 5, 2, 1]
    _pool_block(kv, 2).token_ids = [0, 0, 0, 0]
    c = req("c", 9)
    num_hit, new = admit(kv, c)  # adopts block 1 only; tokens 4-8 recomputed
    assert (num_hit, new.get_block_ids()) == (4, ([3, 4],))
    assert kv.get_block_ids("c") == ([1, 3, 4],)
    kv.check_integrity()


def test_collision_in_a_sliding_window_block() -> None:
    # g0 full, g1 sliding W=5: a hit of L needs only g1's block L/4 - 1.
    kv = manager(20, full(4), swa(4, 5), hash_algo="xxhash")
    admit(kv, req("a", 20))
    assert kv.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert hit_ids(kv, req("c", 21)) == ([1, 2, 3, 4, 5], [0, 0, 0, 0, 10])
    _pool_block(kv, 10).token_ids = [0, 0, 0, 0]
    # L=20 is refused in g1; L=16 needs g1's block 3 (9): fine.
    assert hit_ids(kv, req("d", 21)) == ([1, 2, 3, 4], [0, 0, 0, 9])


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_no_false_refusals_with_mixed_block_sizes(algo: str) -> None:
    # Token slices follow each group's block size (4 and 2): genuine hits pass.
    kv = manager(30, full(4), swa(2, 3), hash_algo=algo)
    admit(kv, req("a", 12))
    assert kv.get_block_ids("a") == ([1, 2, 3], [4, 5, 6, 7, 8, 9])
    assert hit_ids(kv, req("b", 13)) == ([1, 2, 3], [0, 0, 0, 0, 0, 9])
    assert hit_ids(kv, req("c", 11)) == ([1, 2], [0, 0, 0, 7])


@pytest.mark.parametrize(("algo", "recorded"), [("xxhash", True), ("sha256", False)])
def test_token_ids_are_recorded_only_where_hits_check_them(algo: str, recorded: bool) -> None:
    kv = manager(10, full(4), swa(4, 4), hash_algo=algo)
    assert kv.block_pool.record_token_ids is recorded
    a = req("a", 9)
    admit(kv, a)  # two full blocks per group cached
    cached = [b for b in kv.block_pool.blocks if b.block_hash is not None]
    assert len(cached) == 4
    want = [[100, 101, 102, 103], [104, 105, 106, 107]]
    assert sorted(b.token_ids or [] for b in cached) == (sorted(want * 2) if recorded else [[]] * 4)
    kv.check_integrity()
    kv.free(a)
    assert hit_len(kv, req("b", 9)) == 8
    kv.check_integrity()
