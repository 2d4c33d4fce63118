"""Manager misuse: a ``ValueError`` naming the argument, and nothing changed.

"Nothing changed" is checked on everything a later call could trip on:
``check_integrity()``, usage, the free queue in order, every ref count, the
cached blocks and every live request's block table. The two-manager case
checks both pools, then shows that later valid calls still work (before, the
damage surfaced only there, as a bare ``AssertionError`` in the free queue).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from factories import (
    admit,
    cached_ids,
    free_ids,
    full,
    manager,
    prefill,
    ref_counts,
    req,
    swa,
    toks,
)

from hybridkv import KVCacheBlocks, KVCacheManager, Request


def state(kv: KVCacheManager, *rids: str) -> tuple[Any, ...]:
    kv.check_integrity()
    tables = tuple(kv.get_block_ids(r) for r in rids)
    return kv.usage, free_ids(kv), ref_counts(kv), cached_ids(kv), tables


def two_managers_with_the_same_prefix() -> tuple[KVCacheManager, KVCacheManager]:
    managers = (manager(16, full(4), swa(4, 8)), manager(16, full(4), swa(4, 8)))
    for kv in managers:
        r = req("warm", 17)
        prefill(kv, r)
        kv.free(r)
    return managers


def test_another_managers_computed_blocks_are_refused(  # the stale-block check compares pools
) -> None:
    kv1, kv2 = two_managers_with_the_same_prefix()
    r = req("r", 17)
    blocks, num_hit = kv1.get_computed_blocks(r)
    assert num_hit == 16  # kv2 has blocks with the very same hashes
    before1, before2 = state(kv1, "r"), state(kv2, "r")
    with pytest.raises(
        ValueError,
        match=r"new_computed_blocks hold KVCacheBlock.*not a block of "
        "this manager's pool",
    ):
        kv2.allocate_slots(r, 1, num_hit, blocks)
    assert state(kv1, "r") == before1 and state(kv2, "r") == before2
    for kv in (kv2, kv1):  # both pools still serve valid calls, hits included
        fresh = req("fresh", 17)
        assert admit(kv, fresh)[0] == 16
        kv.free(fresh)
        other = req("other", toks(24, start=500))
        prefill(kv, other)
        kv.free(other)
        kv.check_integrity()


def test_computed_blocks_must_be_kvcacheblocks() -> None:
    kv, _ = two_managers_with_the_same_prefix()
    r = req("r", 17)
    before = state(kv, "r")
    with pytest.raises(ValueError, match="new_computed_blocks must be the KVCacheBlocks"):
        kv.allocate_slots(r, 1, 16, [[1, 2, 3, 4], [1, 2, 3, 4]])  # type: ignore[arg-type]
    forged = KVCacheBlocks(([object()] * 4, [object()] * 4))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not a block of this manager's pool"):
        kv.allocate_slots(r, 1, 16, forged)
    assert state(kv, "r") == before


def test_a_live_request_id_with_other_tokens_is_refused() -> None:
    kv = manager(16, full(4))
    first = req("same", 8)
    prefill(kv, first)
    impostor = req("same", toks(8, start=300))
    before = state(kv, "same")
    with pytest.raises(ValueError, match="request: another Request with id 'same'"):
        kv.allocate_slots(impostor, 8)
    assert state(kv, "same") == before
    # The caller may rebuild the very same request (same tokens, same progress).
    rebuilt = req("same", 8)
    rebuilt.num_computed_tokens = 8
    rebuilt.append_output_token_ids(7)
    first.append_output_token_ids(7)
    assert kv.allocate_slots(rebuilt, 1) is not None
    kv.free("same")  # once freed, the id is free for any request
    assert kv.allocate_slots(impostor, 8) is not None
    kv.check_integrity()


@pytest.mark.parametrize("bad", [-10, 9, "5", 2.0, True, None])
def test_num_computed_tokens_outside_the_tokens(bad: object) -> None:
    kv = manager(16, full(4))
    r = req("r", 8)
    prefill(kv, r)
    before = state(kv, "r")
    with pytest.raises(ValueError, match=r"request 'r': num_computed_tokens"):
        r.num_computed_tokens = bad  # type: ignore[assignment]
    assert r.num_computed_tokens == 8 and state(kv, "r") == before


def test_num_computed_tokens_takes_numpy_ints() -> None:
    r = req("r", 8)
    r.num_computed_tokens = np.int64(5)  # type: ignore[assignment]
    assert r.num_computed_tokens == 5 and type(r.num_computed_tokens) is int


@pytest.mark.parametrize("bad", [None, 123, 1.5, b"r"])
def test_free_of_a_non_request(bad: object) -> None:
    kv = manager(16, full(4))
    prefill(kv, req("r", 8))
    before = state(kv, "r")
    with pytest.raises(ValueError, match=r"request must be a hybridkv\.Request or a request id"):
        kv.free(bad)  # type: ignore[arg-type]
    assert state(kv, "r") == before
    assert kv.free("r") and not kv.free("r")


@pytest.mark.parametrize(
    ("bad", "match"),
    [(1.5, "token_ids must be an int in"), (True, "not a bool"), ([3, True], "not bools"),
     ("ab", "not text"), ([2**32], r"token_ids must be ints in \[0, 2\*\*32\)"),
     (-1, "token_ids must be an int in"), ([1.5], "token_ids must be ints")],
)  # fmt: skip
def test_append_output_token_ids_refuses_non_ids(bad: object, match: str) -> None:
    kv = manager(16, full(4))
    r = req("r", 8)
    prefill(kv, r)
    before = state(kv, "r")
    with pytest.raises(ValueError, match=match):
        r.append_output_token_ids(bad)  # type: ignore[arg-type]
    assert list(r.all_token_ids) == list(range(100, 108)) and state(kv, "r") == before


def test_token_id_types_are_the_same_for_prompt_and_append() -> None:
    r = Request("r", [np.int64(5), np.int32(6), 7])  # numpy ints are token ids
    r.append_output_token_ids(np.int64(8))
    r.append_output_token_ids(np.array([9, 10]))
    assert list(r.all_token_ids) == [5, 6, 7, 8, 9, 10]
    assert all(type(t) is int for t in r.output_token_ids)
    with pytest.raises(ValueError, match=r"prompt_token_ids must be ints.*not bools"):
        Request("b", [5, True])  # bools are not, at construction as on append
    with pytest.raises(ValueError, match="not a bool"):
        r.append_output_token_ids(False)
    with pytest.raises(ValueError, match="prompt_token_ids must be a list of token ids"):
        Request("c", 5)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [10, 300])  # below and above the numpy cut-over
def test_a_bool_among_many_zeros_and_ones_is_found(n: int) -> None:
    ids = [i % 3 for i in range(n)]  # zeros and ones everywhere: all are looked at
    assert list(Request("ok", ids).all_token_ids) == ids
    for pos, bad in [(0, False), (n - 1, True), (n // 2, True)]:
        with_bool = list(ids)
        with_bool[pos] = bad
        with pytest.raises(ValueError, match=rf"not bools: got \[{bad}\]"):
            Request("b", with_bool)
    assert list(Request("big", [2**32 - 1, 7] * n).all_token_ids)[:2] == [2**32 - 1, 7]


@pytest.mark.parametrize("differs", ["tokens", "progress"])
def test_a_live_request_id_is_refused_when_only_tokens_or_only_progress_differ(
    differs: str,
) -> None:
    kv = manager(16, full(4))
    first = req("same", 8)
    prefill(kv, first)  # 8 tokens computed
    other = req("same", toks(8, start=300) if differs == "tokens" else 8)
    other.num_computed_tokens = 8 if differs == "tokens" else 4
    before = state(kv, "same")
    with pytest.raises(ValueError, match="request: another Request with id 'same'"):
        kv.allocate_slots(other, 1)
    assert state(kv, "same") == before


def test_a_hit_checked_block_by_block_after_an_eviction() -> None:
    """Once a block has left the index since the lookup, a hit is checked block
    by block: one whose blocks are intact is adopted (its null blocks
    included); one holding the other group's blocks under the same keys is
    stale."""
    kv = manager(32, full(4), full(4), swa(4, 4))
    a = req("a", 12)
    admit(kv, a)
    kv.free(a)
    b = req("b", 13)
    blocks, hit = kv.get_computed_blocks(b)
    assert hit == 12 and blocks.get_block_ids()[2][:2] == [0, 0]  # before the window
    swapped = KVCacheBlocks((blocks.blocks[1], blocks.blocks[0], blocks.blocks[2]))
    before = state(kv, "b")
    with pytest.raises(ValueError, match="stale"):
        kv.allocate_slots(b, 1, hit, swapped)  # the same keys, the other group's blocks
    assert state(kv, "b") == before
    d = req("d", 13)
    admit(kv, d)  # holds the hit's blocks: no eviction can take them
    c = req("c", toks(kv.block_pool.num_free_blocks // 3 * 4, start=900))
    prefill(kv, c)  # takes every free block, evicting a's first sliding blocks
    assert kv.block_pool.generation > blocks.generation
    kv.free(c)
    assert kv.allocate_slots(b, 1, hit, blocks) is not None  # intact: adopted
    shared = [t[:3] for t in kv.get_block_ids("d")]
    assert [t[:3] for t in kv.get_block_ids("b")] == shared  # the hit: d's blocks
    kv.check_integrity()
