"""``FreeBlockStack``: free blocks reused newest first, kept in a Python list.

The cost-aware policy's evict-first set (``hybridkv.policy.cost_aware``) is a
stack: blocks released last are reused first. Under the ``hybrid`` policy
that set turns over every prefill step (a sliding-window group's blocks fall
out of the window, are released evict-first and are popped again by the next
chunk), so push and pop are list slices, done in C; there are no links to
set per block. The price is ``remove`` (a hit on a free block in the
stack): it searches from the top, where recently released blocks are, and
costs O(depth). Blocks in the stack keep ``prev_free`` / ``next_free`` None.
"""

from __future__ import annotations

from collections.abc import Iterator

from hybridkv.core.block import KVCacheBlock

#: How far from the top ``remove`` searches before the whole stack.
_NEAR_TOP = 256


class FreeBlockStack:
    """Free blocks, the last pushed reused first (``popleft_n`` pops it)."""

    __slots__ = ("_items",)

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        """``blocks`` in reuse order: ``blocks[0]`` is popped first."""
        self._items = blocks[::-1]  # the top is the end of the list

    @property
    def num_free_blocks(self) -> int:
        return len(self._items)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the ``n`` blocks reused first, in that order."""
        items = self._items
        if n > len(items):
            raise ValueError(f"asked for {n} blocks, {len(items)} free")
        if n <= 0:
            return []
        out = items[-n:]
        del items[-n:]
        out.reverse()
        return out

    def appendleft(self, block: KVCacheBlock) -> None:
        """Push one block: it is reused before every other."""
        self._items.append(block)

    def extendleft(self, blocks: list[KVCacheBlock]) -> None:
        """``appendleft`` each of ``blocks`` in turn: the last one is reused first."""
        self._items += blocks

    def remove(self, block: KVCacheBlock) -> None:
        """Take ``block`` out, wherever it is (searched from the top)."""
        items = self._items
        lo = max(0, len(items) - _NEAR_TOP)
        try:
            i = items.index(block, lo)
        except ValueError:
            try:
                i = items.index(block, 0, lo)
            except ValueError:
                raise ValueError(f"{block} is not in the free stack") from None
        del items[i]

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Blocks in reuse order."""
        return reversed(self._items)

    def check_integrity(self) -> None:
        """No block twice, none linked into a queue, no null block."""
        items = self._items
        assert len(set(map(id, items))) == len(items), "a block is in the free stack twice"
        for b in items:
            assert b.prev_free is None and b.next_free is None, f"{b} is also linked in a queue"
            assert not b.is_null, "the null block is in the free stack"
