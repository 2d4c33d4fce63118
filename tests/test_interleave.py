"""``hybridkv.policy.interleave``: the chunks are the per-block release order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.core.block import KVCacheBlock
from hybridkv.policy.interleave import Lane, interleave

VALUES = [None, 1.0, 2.5, 4.0]


@st.composite
def lanes(draw: st.DrawFn) -> list[Lane]:
    """Up to 5 lanes of one block size (sometimes two), each with ascending,
    disjoint spans of a few values; some lanes repeat the previous lane's spans
    (groups of one kind)."""
    sizes = draw(st.sampled_from([[4], [4], [2, 6]]))
    out: list[Lane] = []
    for g in range(draw(st.integers(0, 5))):
        n = draw(st.integers(0, 24))
        table = [KVCacheBlock(100 * g + i) for i in range(n)]
        if out and len(out[-1][0]) == n and draw(st.booleans()):
            spans = list(out[-1][2])
        else:
            spans = []
            i = draw(st.integers(0, 3))
            while i < n:
                j = min(n, i + draw(st.integers(1, 6)))
                if draw(st.booleans()):
                    spans.append((i, j, draw(st.sampled_from(VALUES))))
                i = j + draw(st.integers(0, 1))
        out.append((table, draw(st.sampled_from(sizes)), spans))
    return out


def reference(ls: list[Lane]) -> list[tuple[int, float | None]]:
    """Every block with its value, by end position descending, then lane."""
    entries = [
        ((i + 1) * bs, g, table[i].block_id, v)
        for g, (table, bs, spans) in enumerate(ls)
        for lo, hi, v in spans
        for i in range(lo, hi)
    ]
    entries.sort(key=lambda e: (-e[0], e[1]))
    return [(block_id, v) for _, _, block_id, v in entries]


@settings(max_examples=400, deadline=None)
@given(lanes())
def test_chunks_are_the_block_by_block_order(ls: list[Lane]) -> None:
    chunks = interleave(ls)
    assert all(blocks for blocks, _ in chunks)
    assert [(b.block_id, v) for blocks, v in chunks for b in blocks] == reference(ls)


def test_two_groups_by_hand() -> None:
    # Block size 4: lane 0 holds [1, 4) at 2.5, lane 1 holds [2, 4) at 2.5 and
    # [0, 1) at 1.0. From the top: index 3 (lane 0, lane 1), 2 (both), then 1
    # (lane 0 alone), then lane 1's index 0 at its own value.
    a = [KVCacheBlock(i) for i in range(4)]
    b = [KVCacheBlock(10 + i) for i in range(4)]
    chunks = interleave([(a, 4, [(1, 4, 2.5)]), (b, 4, [(0, 1, 1.0), (2, 4, 2.5)])])
    assert [([x.block_id for x in blocks], v) for blocks, v in chunks] == [
        ([3, 13, 2, 12], 2.5),
        ([1], 2.5),
        ([10], 1.0),
    ]
