"""Several groups' release spans in one release order (``hybridkv.policy.release``).

Each group is a *lane*: its blocks by table index, its block size, and
ascending, disjoint index ranges ``[lo, hi)`` each released with one value.
The release order is by a block's end position, ``(index + 1) x block
size``, descending, then by lane (group) order; ``interleave`` returns it as
``(blocks, value)`` chunks. With one block size the work is per range, not
per block: reversed slices, zipped by slice assignment where several groups
hold an index::

    lane 0   ........[   v   ][   v   ]
    lane 1   ..................[   v   ]
    chunks   [x, y) from the top: lane 0's and lane 1's entries zipped,
             deepest first; then lane 0's alone
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby, pairwise, repeat

from hybridkv.core.block import KVCacheBlock

#: Index ranges ``[lo, hi)`` and the value they are released with.
Span = tuple[int, int, "float | None"]
#: One group's side of an interleave: blocks by table index, block size, spans.
Lane = tuple[list[KVCacheBlock], int, list[Span]]
#: Blocks released together, with their value.
Chunk = tuple[list[KVCacheBlock], "float | None"]


def interleave(lanes: Sequence[Lane]) -> list[Chunk]:
    """The lanes' spans as ``(blocks, value)`` chunks in release order: end
    position descending, then group (lane) order.

    With one block size, consecutive lanes with the same spans (groups of one
    kind: their tables zip at every index) go as one, and the indices are cut
    where any span starts or ends; each elementary range is one reversed
    slice, or, where several groups hold it, their reversed slices zipped
    (one chunk per run of groups of one value at each index). Different block
    sizes merge by a sort.
    """
    live = [lane for lane in lanes if lane[2]]
    if not live:
        return []
    bs = live[0][1]
    #: Consecutive lanes with equal spans: ``(tables, spans)``.
    bundles: list[tuple[list[list[KVCacheBlock]], list[Span]]] = []
    tables: list[list[KVCacheBlock]] = []
    last: list[Span] | None = None
    for blocks, size, spans in live:
        if size != bs:
            return merge_sorted(live)
        if spans == last:
            tables.append(blocks)
        else:
            tables = [blocks]
            bundles.append((tables, spans))
            last = spans
    if len(bundles) == 1:
        return [(zipped(tables, lo, hi), v) for lo, hi, v in reversed(bundles[0][1])]
    edges = set()
    for _, spans in bundles:
        for lo, hi, _ in spans:
            edges.add(lo)
            edges.add(hi)
    bounds = sorted(edges)
    ptrs = [len(spans) - 1 for _, spans in bundles]
    out: list[Chunk] = []
    y = bounds.pop()
    while bounds:  # the elementary range [x, y), from the top
        x = bounds.pop()
        cover: list[list[KVCacheBlock]] = []
        vals: list[float | None] = []
        for g, (tabs, spans) in enumerate(bundles):
            k = ptrs[g]
            while k >= 0 and spans[k][0] >= y:
                k -= 1
            ptrs[g] = k
            if k >= 0 and spans[k][1] >= y:  # starts at or below x: covers [x, y)
                v = spans[k][2]
                cover += tabs
                vals += [v] * len(tabs)
        if cover:
            if vals.count(vals[0]) == len(vals):
                out.append((zipped(cover, x, y), vals[0]))
            else:  # groups of different values at each index: one chunk per run of equal ones
                cuts = [0, *(i for i in range(1, len(vals)) if vals[i] != vals[i - 1]), len(vals)]
                parts = [(a, z, vals[a]) for a, z in pairwise(cuts)]
                for row in zip(*[t[x:y][::-1] for t in cover], strict=True):
                    for a, z, v in parts:
                        out.append((list(row[a:z]), v))
        y = x
    return out


def zipped(tables: list[list[KVCacheBlock]], lo: int, hi: int) -> list[KVCacheBlock]:
    """The tables' entries ``[lo, hi)``, each reversed, interleaved: entry
    ``hi - 1`` of each table in turn, then ``hi - 2``... (slice assignment in C)."""
    if len(tables) == 1:
        return tables[0][lo:hi][::-1]
    k = len(tables)
    out: list[KVCacheBlock] = [None] * (k * (hi - lo))  # type: ignore[list-item]
    for i, t in enumerate(tables):
        out[i::k] = t[lo:hi][::-1]
    return out


def merge_sorted(lanes: Sequence[Lane]) -> list[Chunk]:
    """``interleave`` for lanes of different block sizes: every block's end
    position keyed (then its lane), one sort."""
    keys: list[int] = []
    blocks: list[KVCacheBlock] = []
    values: list[float | None] = []
    n = len(lanes)
    for g, (table, bs, spans) in enumerate(lanes):
        for lo, hi, v in spans:
            # key = end position x n + (n - 1 - lane): descending is deepest first, then lane order
            keys += range((lo + 1) * bs * n + n - 1 - g, (hi + 1) * bs * n, bs * n)
            blocks += table[lo:hi]
            values += repeat(v, hi - lo)
    order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
    return [([blocks[i] for i in same], v) for v, same in groupby(order, values.__getitem__)]
