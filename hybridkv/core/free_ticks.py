"""``TickQueue``: the free blocks of one value class, in release order, by tick.

A cost-aware free set (``hybridkv.policy.cost_aware``) numbers the keyed blocks
it releases (a block's *tick*: the keyed blocks released before it, plus one);
within one value class the eviction key grows with the tick, so a class is a
FIFO. A freed request's run of blocks enters as a run: the blocks and their
(consecutive) ticks are appended to two parallel lists in C, and each block
records its class and tick (``free_class`` / ``free_tick``), one loop of two
stores; no links, no key per block (the key is computed from the tick when a
class head is compared).

A hit on a free block (``remove``) leaves its entry behind as a *tombstone*:
an entry is live iff its block's ``free_tick`` is the entry's tick (ticks are
never reused, and ``remove`` clears the block's). Tombstones are skipped when
they reach the head, and the lists are compacted when they outnumber the live
entries, so memory stays O(live blocks)::

    ticks   [ 7  8  9 12 13 14]     head -> 8 (7 was taken)
    blocks  [ a  b  c  d  e  f]     c.free_tick is None: a tombstone
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import pairwise

from hybridkv.core.block import KVCacheBlock

#: Consumed or dead entries tolerated before the lists are rebuilt.
_SLACK = 64


class TickQueue:
    """Free blocks of class ``cls``, oldest tick first (module docstring)."""

    __slots__ = ("_blocks", "_head", "_ticks", "cls", "num_free_blocks")

    def __init__(self, cls: int) -> None:
        self.cls = cls
        self._blocks: list[KVCacheBlock] = []
        self._ticks: list[int] = []
        self._head = 0  # entries before it were taken
        self.num_free_blocks = 0  # live entries

    def push(self, blocks: list[KVCacheBlock], first_tick: int) -> None:
        """Append ``blocks`` with ticks ``first_tick, first_tick + 1, ...`` (above
        every tick in the queue); each records this class and its tick."""
        cls = self.cls
        for tick, b in enumerate(blocks, first_tick):
            b.free_class = cls
            b.free_tick = tick
        self._blocks += blocks
        self._ticks += range(first_tick, first_tick + len(blocks))
        self.num_free_blocks += len(blocks)

    def remove(self, block: KVCacheBlock) -> None:
        """Take a live block out (a hit): its entry becomes a tombstone."""
        if block.free_class != self.cls or block.free_tick is None:
            raise ValueError(f"{block} is not in class {self.cls}'s queue")
        block.free_tick = None
        self.num_free_blocks -= 1
        if len(self._ticks) - self._head > 2 * self.num_free_blocks + _SLACK:
            self._compact()

    def head_tick(self) -> int | None:
        """The tick of the oldest live block (tombstones before it are dropped);
        None when the queue is empty."""
        if not self.num_free_blocks:
            return None
        blocks, ticks = self._blocks, self._ticks
        h = self._head
        while blocks[h].free_tick != ticks[h]:
            h += 1
        self._head = h
        return ticks[h]

    def pop_upto(self, n: int, max_tick: int) -> list[KVCacheBlock]:
        """Remove and return the oldest live blocks while their tick is at most
        ``max_tick``, at most ``n`` of them. Each keeps its ``free_class`` and
        ``free_tick`` (the entry is consumed; the tick is never reused)."""
        blocks, ticks = self._blocks, self._ticks
        h = self._head
        hi = bisect_right(ticks, max_tick, h)
        if hi - h > n:
            hi = h + n
        seg = blocks[h:hi]
        if [b.free_tick for b in seg] == ticks[h:hi]:  # no tombstone: one slice
            out = seg
            h = hi
        else:
            out = []
            stop = len(ticks)
            while h < stop and len(out) < n and ticks[h] <= max_tick:
                b = blocks[h]
                if b.free_tick == ticks[h]:
                    out.append(b)
                h += 1
        self._head = h
        self.num_free_blocks -= len(out)
        if h > _SLACK and 2 * h > len(ticks):
            del blocks[:h]
            del ticks[:h]
            self._head = 0
        return out

    def _compact(self) -> None:
        """Drop the taken entries and the tombstones (order and ticks unchanged)."""
        live = list(self)
        self._ticks = [t for t, _ in live]
        self._blocks = [b for _, b in live]
        self._head = 0

    def __iter__(self) -> Iterator[tuple[int, KVCacheBlock]]:
        """``(tick, block)`` of the live blocks, oldest first."""
        ticks, blocks = self._ticks, self._blocks
        for j in range(self._head, len(ticks)):
            b = blocks[j]
            if b.free_tick == ticks[j]:
                yield ticks[j], b

    def check_integrity(self) -> None:
        """Ticks ascend; the live entries are ``num_free_blocks`` free blocks of
        this class, each once, none linked into a queue, none null."""
        ticks = self._ticks[self._head :]
        assert all(a < b for a, b in pairwise(ticks)), "ticks not ascending"
        live = [b for _, b in self]
        assert len(live) == self.num_free_blocks, (
            f"class {self.cls}: {self.num_free_blocks} free, {len(live)} live entries"
        )
        assert len(set(map(id, live))) == len(live), "a block is live twice"
        for b in live:
            assert b.free_class == self.cls, f"{b} is in class {self.cls}, says {b.free_class}"
            assert b.prev_free is None and b.next_free is None, f"{b} is also linked"
            assert not b.is_null and b.ref_cnt == 0, f"{b} is not a free block"
