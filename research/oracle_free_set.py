"""A free set that knows the future: Belady inside the real simulator.

``OracleFreeSet`` is an ``EvictionPolicy`` (``hybridkv.core.eviction``) for a replay
under ``lru`` (every block boundary's Mamba state is snapshotted and cached). It is
given, for every block hash and kind (KV or Mamba state), the requests whose planned
hit will read it (``Needs``), and a ``Clock`` holding the last request whose hit was
looked up. A free block's *next need* is the first planned reader after the clock.
``take`` reuses first the blocks without a hash and those released evict-first, then
the block whose next need is farthest (never first), the deepest block first on ties.
A block's next need only moves when the clock passes it; the set re-ranks such
blocks before each ``take`` (a second heap ordered by next need).

It decides nothing any online rule could: it is a reference, not a policy.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.eviction import EvictionPolicy

NEVER = 1 << 62


@dataclass
class Clock:
    """The last request (trace index) whose hit the manager looked up."""

    now: int = -1


@dataclass
class Needs:
    """``(kind, block hash) -> (depth, ascending requests whose planned hit reads it)``;
    kind 0: a full-attention block, 1: a Mamba state (the one after that block)."""

    table: dict[tuple[int, bytes], tuple[int, list[int]]] = field(default_factory=dict)

    def add(self, kind: int, key: bytes, depth: int, request: int) -> None:
        entry = self.table.get((kind, key))
        if entry is None:
            self.table[(kind, key)] = (depth, [request])
        else:
            entry[1].append(request)

    def after(self, kind: int, key: bytes, now: int) -> tuple[int, int]:
        """(depth, the first request after ``now`` that needs it, ``NEVER``: none)."""
        entry = self.table.get((kind, key))
        if entry is None:
            return 0, NEVER
        depth, reqs = entry
        i = bisect_right(reqs, now)
        return depth, reqs[i] if i < len(reqs) else NEVER


def plan_needs(
    hashes: Sequence[Sequence[bytes]], depth: Sequence[int], state_kind: bool = True
) -> Needs:
    """The needs of a plan: request ``r`` reads KV ``hashes[r][:depth[r]]`` and the
    state after block ``depth[r]`` (keyed by ``hashes[r][depth[r] - 1]``)."""
    needs = Needs()
    for r, (hs, d) in enumerate(zip(hashes, depth, strict=True)):
        for j in range(d):
            needs.add(0, hs[j], j, r)
        if d and state_kind:
            needs.add(1, hs[d - 1], d - 1, r)
    return needs


class OracleFreeSet(EvictionPolicy):
    """The module docstring's free set over ``blocks``; ``kv_group``: the
    full-attention group's id (every other group holds Mamba states)."""

    def __init__(
        self, blocks: list[KVCacheBlock], needs: Needs, clock: Clock, kv_group: int
    ) -> None:
        self.needs, self.clock, self.kv_group = needs, clock, kv_group
        self.first: dict[int, KVCacheBlock] = {b.block_id: b for b in blocks}
        self.ranked: dict[int, tuple[int, KVCacheBlock]] = {}  # id -> (version, block)
        self.far: list[tuple[int, int, int, int]] = []  # (-need, -depth, version, id)
        self.near: list[tuple[int, int, int]] = []  # (need, version, id)
        self.version = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.first) + len(self.ranked)

    def _rank(self, b: KVCacheBlock) -> None:
        assert b.block_hash is not None
        kind = 0 if b.group_id == self.kv_group else 1
        depth, need = self.needs.after(kind, b.block_hash, self.clock.now)
        self.version += 1
        self.ranked[b.block_id] = (self.version, b)
        heapq.heappush(self.far, (-need, -depth, self.version, b.block_id))
        if need != NEVER:
            heapq.heappush(self.near, (need, self.version, b.block_id))

    def release(
        self,
        blocks: Iterable[KVCacheBlock],
        *,
        evict_first: bool = False,
        value: float | None = None,
    ) -> None:
        for b in blocks:
            if evict_first or b.block_hash is None:
                self.first[b.block_id] = b
            else:
                self._rank(b)

    def remove(self, block: KVCacheBlock) -> None:
        if self.first.pop(block.block_id, None) is None:
            del self.ranked[block.block_id]

    def _refresh(self) -> None:
        """Re-rank the blocks whose next need the clock has passed."""
        now = self.clock.now
        while self.near and self.near[0][0] <= now:
            _, version, bid = heapq.heappop(self.near)
            entry = self.ranked.get(bid)
            if entry is not None and entry[0] == version:
                self._rank(entry[1])

    def take(self, n: int) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        while self.first and len(out) < n:
            out.append(self.first.pop(next(iter(self.first))))
        if len(out) < n:
            self._refresh()
        while len(out) < n:
            _, _, version, bid = heapq.heappop(self.far)
            entry = self.ranked.get(bid)
            if entry is not None and entry[0] == version:
                del self.ranked[bid]
                out.append(entry[1])
        return out

    def __iter__(self) -> Iterator[KVCacheBlock]:
        yield from self.first.values()
        live = [e for e in self.far if self.ranked.get(e[3], (None,))[0] == e[2]]
        for e in sorted(live):
            yield self.ranked[e[3]][1]

    def check_integrity(self) -> None:
        assert not set(self.first) & set(self.ranked), "a block both first and ranked"
        live = {e[3] for e in self.far if self.ranked.get(e[3], (None,))[0] == e[2]}
        assert live == set(self.ranked), "a ranked block without its heap entry"
        for b in (*self.first.values(), *(e[1] for e in self.ranked.values())):
            assert b.ref_cnt == 0, f"free block {b.block_id} has ref_cnt {b.ref_cnt}"
