"""``KVCacheManager.cannot_admit`` by hand: the bound follows a hit that grew
since the last lookup, and says "cannot" only when the full path fails."""

from __future__ import annotations

import pytest
from factories import full, manager, req, swa


def _setup(num_blocks: int):  # type: ignore[no-untyped-def]
    kv = manager(num_blocks, full(4), swa(4, 8))
    a = req("a", 16)  # tokens 100..115
    b = req("b", [*range(100, 116), *range(500, 508)])  # a's 16 tokens, then 8 of its own
    return kv, a, b


def test_the_bound_follows_a_hit_that_grew_since_the_last_lookup() -> None:
    # 16 blocks (15 usable). b's lookup finds nothing; then a computes and
    # caches the 16 tokens b starts with (4 blocks per group, 8 in all).
    kv, a, b = _setup(16)
    _, hit = kv.get_computed_blocks(b)
    assert hit == 0
    blocks, n = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 16, n, blocks) is not None
    a.num_computed_tokens = 16
    assert kv.block_pool.num_free_blocks == 7
    # With its last lookup's hit (0), b would need 6 + 6 new blocks > 7 free.
    # But a's first 4 full blocks are cached now: b's hit can reach 16 tokens,
    # where it needs 2 new blocks per group (sliding: the window's hit blocks
    # are a's, held: no free block leaves). So the bound must not say no...
    assert not kv.cannot_admit(b, 2048)
    # ... and indeed b fits.
    blocks, hit = kv.get_computed_blocks(b)
    assert hit == 16
    assert kv.allocate_slots(b, 8, hit, blocks) is not None
    kv.check_integrity()


def test_the_bound_says_no_only_when_allocation_fails() -> None:
    kv, a, _ = _setup(12)  # 11 usable blocks
    blocks, n = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 16, n, blocks) is not None  # 8 blocks, 3 free
    a.num_computed_tokens = 16
    c = req("c", range(900, 924))  # 24 tokens of its own: 12 new blocks, nothing to hit
    _, hit = kv.get_computed_blocks(c)
    assert hit == 0 and kv.block_pool.num_free_blocks == 3
    assert kv.cannot_admit(c, 2048)  # 12 > 3
    # A 4-token chunk needs 1 + 1 new blocks: they fit, so the bound is unsure...
    assert not kv.cannot_admit(c, 4)
    blocks, hit = kv.get_computed_blocks(c)
    assert kv.allocate_slots(c, 4, hit, blocks) is not None  # ... and rightly so
    kv.check_integrity()


def test_no_bound_with_stats_or_for_a_request_that_has_tables() -> None:
    kv = manager(12, full(4), swa(4, 8), log_stats=True)
    c = req("c", 24)
    kv.get_computed_blocks(c)
    assert not kv.cannot_admit(c, 2048)  # stats count every lookup: never skipped
    kv, a, _ = _setup(12)
    blocks, n = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 4, n, blocks) is not None
    a.num_computed_tokens = 4
    assert not kv.cannot_admit(a, 2048)  # running, not waiting


def test_the_bound_is_exact_at_the_edge_and_for_one_token() -> None:
    kv, a, _ = _setup(11)  # 10 usable blocks
    blocks, n = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 16, n, blocks) is not None
    a.num_computed_tokens = 16
    assert kv.block_pool.num_free_blocks == 2
    c = req("c", range(900, 924))
    kv.get_computed_blocks(c)
    assert kv.cannot_admit(c, 5)  # 2 + 2 new blocks > 2 free
    assert not kv.cannot_admit(c, 4)  # 1 + 1 new blocks == 2 free: it fits
    blocks, hit = kv.get_computed_blocks(c)
    assert kv.allocate_slots(c, 4, hit, blocks) is not None
    c.num_computed_tokens = 4
    d = req("d", range(700, 724))
    kv.get_computed_blocks(d)
    assert kv.block_pool.num_free_blocks == 0
    assert kv.cannot_admit(d, 1)  # even one token needs a block per group
    kv.check_integrity()


def test_a_fully_cached_prompt_and_another_request_under_the_same_id() -> None:
    kv, a, _ = _setup(16)
    twin = req("t", 16)  # a's tokens: its lookup hits nothing yet
    kv.get_computed_blocks(twin)
    blocks, n = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 16, n, blocks) is not None
    a.num_computed_tokens = 16
    kv.free(a)  # every block of twin's prompt is cached now
    assert not kv.cannot_admit(twin, 2048)  # the hit grew to the whole prompt: unsure
    other = req("t", range(300, 316))  # same id, other tokens: the memo is not its
    assert not kv.cannot_admit(other, 2048)


def test_the_memo_forgets_admitted_and_freed_requests() -> None:
    kv, a, b = _setup(16)
    kv.get_computed_blocks(b)
    kv.free(b)  # dropped while waiting
    blocks, n = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 4, n, blocks) is not None  # admitted
    assert kv._admission._last == {}
    kv.check_integrity()


def test_cannot_admit_checks_its_request() -> None:
    kv, _, _ = _setup(16)
    with pytest.raises(ValueError, match=r"must be a hybridkv\.Request"):
        kv.cannot_admit("b", 8)  # type: ignore[arg-type]
