"""``FreeKVCacheBlockQueue``: an intrusive doubly linked list of free blocks.

Links live on the blocks themselves (``prev_free`` / ``next_free``), between
two sentinels, so removal from the middle (a prefix hit on a free cached
block) is O(1) and no per-operation Python objects are created.
"""

from __future__ import annotations

from collections.abc import Iterator

from hybridkv.core.block import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Free blocks in reuse order (head first)."""

    __slots__ = ("head", "num_free_blocks", "tail")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-2)
        prev = self.head
        for b in blocks:
            prev.next_free = b
            b.prev_free = prev
            prev = b
        prev.next_free = self.tail
        self.tail.prev_free = prev
        self.num_free_blocks = len(blocks)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the first ``n`` blocks."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        out = []
        b = self.head.next_free
        for _ in range(n):
            assert b is not None
            nxt = b.next_free
            b.prev_free = b.next_free = None
            out.append(b)
            b = nxt
        assert b is not None
        self.head.next_free = b
        b.prev_free = self.head
        self.num_free_blocks -= n
        return out

    def popleft_keyed(self, n: int, limit: float) -> list[KVCacheBlock]:
        """Remove and return head blocks while their ``evict_key`` is at most
        ``limit``, at most ``n`` of them (one pass: a cost-aware policy's class
        run, ``hybridkv.policy.cost_aware``)."""
        out: list[KVCacheBlock] = []
        append = out.append
        head, end = self.head, self.tail
        b = head.next_free
        k = 0
        while k < n and b is not end and b.evict_key <= limit:  # type: ignore[union-attr]
            nxt = b.next_free  # type: ignore[union-attr]
            b.prev_free = b.next_free = None  # type: ignore[union-attr]
            append(b)  # type: ignore[arg-type]
            b = nxt
            k += 1
        assert b is not None
        head.next_free = b
        b.prev_free = head
        self.num_free_blocks -= k
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from anywhere in the queue."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Insert at the tail (reused last)."""
        last = self.tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self.tail
        self.tail.prev_free = block
        self.num_free_blocks += 1

    def appendleft(self, block: KVCacheBlock) -> None:
        """Insert at the head (reused first)."""
        first = self.head.next_free
        assert first is not None
        first.prev_free = block
        block.next_free = first
        block.prev_free = self.head
        self.head.next_free = block
        self.num_free_blocks += 1

    def extend(self, blocks: list[KVCacheBlock]) -> None:
        """``append`` each of ``blocks`` in turn (one pass, no call per block)."""
        if not blocks:
            return
        last = self.tail.prev_free
        assert last is not None
        for b in blocks:
            last.next_free = b
            b.prev_free = last
            last = b
        last.next_free = self.tail
        self.tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def extendleft(self, blocks: list[KVCacheBlock]) -> None:
        """``appendleft`` each of ``blocks`` in turn: the last one ends up first."""
        if not blocks:
            return
        nxt = self.head.next_free
        assert nxt is not None
        for b in blocks:
            nxt.prev_free = b
            b.next_free = nxt
            nxt = b
        nxt.prev_free = self.head
        self.head.next_free = nxt
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        b = self.head.next_free
        while b is not self.tail:
            assert b is not None
            yield b
            b = b.next_free

    def check_integrity(self) -> None:
        """Links are symmetric and the count matches the list."""
        n = 0
        prev = self.head
        b = self.head.next_free
        while b is not self.tail:
            assert b is not None, "broken free list"
            assert b.prev_free is prev, f"bad back link at {b}"
            n += 1
            prev = b
            b = b.next_free
        assert self.tail.prev_free is prev, "bad tail link"
        assert n == self.num_free_blocks, f"free count {self.num_free_blocks} != {n} linked"
