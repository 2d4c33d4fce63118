"""The hit scan of groups with skips (sliding window, chunked, Mamba) finds
the longest end whose needed blocks are all cached: checked against brute
force over random cache contents."""

from __future__ import annotations

import pytest
from factories import chunked, full, mamba, manager, swa
from hypothesis import given
from hypothesis import strategies as st

SPECS = {"sliding": swa(4, 9), "chunked": chunked(4, 8), "mamba": mamba(4)}


@pytest.mark.parametrize("kind", list(SPECS))
@given(cached=st.lists(st.booleans(), max_size=24), cap=st.integers(0, 110))
def test_scan_matches_brute_force(kind: str, cached: list[bool], cap: int) -> None:
    kv = manager(40, full(4), SPECS[kind])
    m = kv.coordinator.managers[1]
    pool = kv.block_pool
    hashes = [bytes([i]) * 8 for i in range(len(cached))]
    for i, c in enumerate(cached):
        if c:
            b = pool.blocks[i + 1]
            b.block_hash, b.group_id = hashes[i], 1
            pool.cached[1][hashes[i]] = b
    got = m.find_longest_cache_hit(hashes, cap)
    best = 0
    for end in range(1, min(cap // 4, len(hashes)) + 1):
        if all(cached[m.first_needed_block(end * 4) : end]):
            best = end
    assert len(got) == best
    first = m.first_needed_block(best * 4) if best else 0
    assert all(b is pool.null_block for b in got[:first])
    assert [b.block_id for b in got[first:]] == [i + 1 for i in range(first, best)]
