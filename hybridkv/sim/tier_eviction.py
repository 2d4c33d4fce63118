"""``TakeRecorder``: the device free set, with what it evicts noted for demotion.

``hybridkv simulate --host-memory`` under ``hybrid`` demotes what the device
pool evicts. The pool evicts a cached block when its free set hands it out
for reuse (``EvictionPolicy.take``), and at that moment the block still has
its key and the class of its value (``free_class``: the half-octave class of
what a hit on its unit saves per page; None for a block released
``evict_first``, which no kept point needs). ``TakeRecorder`` wraps the free
set the policy chose (passed to ``KVCacheManager`` as its ``eviction_policy``
factory) and appends ``(group, hash, class)`` of each keyed block it hands
out to a list; it changes no decision: every call is the inner policy's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.eviction import EvictionPolicy, LRUEvictionPolicy

#: What a taken keyed block was: its group, hash and value class (None: evict-first).
Taken = tuple[int, bytes, int | None]


class TakeRecorder(EvictionPolicy):
    """``inner``'s decisions, with each keyed block ``take`` hands out noted in
    ``sink``. ``classed``: ``inner`` queues blocks by value class (a cost-aware
    free set); else every block is noted with class 0 (LRU knows no values)."""

    def __init__(self, inner: EvictionPolicy, sink: list[Taken], classed: bool = True) -> None:
        self.inner = inner
        self.sink = sink
        self.classed = classed
        self.ranks_by_value = inner.ranks_by_value
        #: The value weight ``make_policy`` reads off the free set (0: none).
        self.weight: float = getattr(inner, "weight", 0.0)

    @property
    def num_free_blocks(self) -> int:
        return self.inner.num_free_blocks

    def release(
        self,
        blocks: Iterable[KVCacheBlock],
        *,
        evict_first: bool = False,
        value: float | None = None,
    ) -> None:
        self.inner.release(blocks, evict_first=evict_first, value=value)

    def remove(self, block: KVCacheBlock) -> None:
        self.inner.remove(block)

    def take(self, n: int) -> list[KVCacheBlock]:
        blocks = self.inner.take(n)
        sink = self.sink
        for b in blocks:
            if b.block_hash is not None:
                assert b.group_id is not None
                sink.append((b.group_id, b.block_hash, b.free_class if self.classed else 0))
        return blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self.inner)

    def check_integrity(self) -> None:
        self.inner.check_integrity()


def recording(
    factory: Callable[[list[KVCacheBlock]], EvictionPolicy] | None, sink: list[Taken]
) -> Callable[[list[KVCacheBlock]], EvictionPolicy]:
    """A free-set factory: ``factory``'s (None: the pool's LRU) inside a ``TakeRecorder``."""
    inner: Any = factory if factory is not None else LRUEvictionPolicy

    def build(blocks: list[KVCacheBlock]) -> EvictionPolicy:
        return TakeRecorder(inner(blocks), sink, classed=factory is not None)

    return build
