"""Eviction policies: which free block is reused next.

A policy owns the set of free blocks (ref count 0, including cached blocks that
can still be hit). The block pool tells it when blocks become free
(``release``), when a free block is hit and leaves the set (``remove``), and
asks it for blocks to reuse (``take``); popping a cached block evicts it, which
the pool does. Policies never touch hashes or ref counts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.free_queue import FreeKVCacheBlockQueue


class EvictionPolicy(ABC):
    """The ordered set of free blocks."""

    #: True when ``release(..., value=)`` changes the order (the ``hybrid``
    #: coordinator computes unit values only then).
    ranks_by_value: bool = False

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """Number of free blocks."""

    @abstractmethod
    def release(
        self,
        blocks: Iterable[KVCacheBlock],
        *,
        evict_first: bool = False,
        value: float | None = None,
    ) -> None:
        """Add blocks whose ref count just reached 0, in release order.

        ``evict_first``: the blocks are worth nothing to keep; reuse them
        before every other free block. ``value``: prefill tokens a hit on
        the blocks' unit saves per page it holds (cost-aware policies rank
        by it; others ignore it)."""

    @abstractmethod
    def remove(self, block: KVCacheBlock) -> None:
        """Take a free block out of the set (it was hit), in O(1)."""

    @abstractmethod
    def take(self, n: int) -> list[KVCacheBlock]:
        """Remove and return ``n`` blocks to reuse (caller checked ``n`` fits)."""

    def take_each(self, counts: list[int]) -> list[list[KVCacheBlock]]:
        """``[take(n) if n else [] for n in counts]`` (several tables grown at
        once, ``BlockPool.get_new_blocks_each``); a policy may do it in one pass."""
        take = self.take
        return [take(n) if n else [] for n in counts]

    @abstractmethod
    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Free blocks, next to be reused first."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Assert the policy's internal invariants."""


class LRUEvictionPolicy(EvictionPolicy):
    """Least recently used, with hashless blocks reused first.

    The free queue starts in block-id order; ``take`` pops from the head.
    Released blocks with a hash (reusable prefix) go to the tail; blocks
    without one (partial blocks: nothing to reuse) go to the head, in the
    order of one ``release`` call (vLLM 0.33's free queue: a call's first
    hashless block is reused first). Requests release their blocks tail-first,
    so a finished sequence's tail is evicted before its prefix.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.queue = FreeKVCacheBlockQueue(blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.queue.num_free_blocks

    def release(
        self,
        blocks: Iterable[KVCacheBlock],
        *,
        evict_first: bool = False,
        value: float | None = None,
    ) -> None:
        q = self.queue
        if evict_first:
            for b in blocks:
                q.appendleft(b)
            return
        blocks = blocks if isinstance(blocks, list) else list(blocks)
        # Keyed blocks to the tail, hashless ones to the head, each in one pass.
        q.extend([b for b in blocks if b.block_hash is not None])
        first = [b for b in blocks if b.block_hash is None]
        if first:  # at the head in release order (vLLM 0.33's ``prepend_n``)
            first.reverse()
            q.extendleft(first)

    def remove(self, block: KVCacheBlock) -> None:
        self.queue.remove(block)

    def take(self, n: int) -> list[KVCacheBlock]:
        return self.queue.popleft_n(n)

    def take_each(self, counts: list[int]) -> list[list[KVCacheBlock]]:
        # ``take`` pops the head: one pop of the sum, cut in turn, is the same.
        if type(self).take is not LRUEvictionPolicy.take:
            return super().take_each(counts)  # a subclass takes its own way
        blocks = self.queue.popleft_n(sum(counts))
        out = []
        i = 0
        for n in counts:
            out.append(blocks[i : i + n])
            i += n
        return out

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self.queue)

    def check_integrity(self) -> None:
        self.queue.check_integrity()


#: What ``BlockPool(eviction_policy=...)`` takes: a policy class, or any
#: callable building one from the initial free blocks (``functools.partial``).
PolicyFactory = Callable[[list[KVCacheBlock]], EvictionPolicy]
