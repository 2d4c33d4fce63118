"""``TakeRecorder``: the device free set, with what it evicts noted for demotion.

``hybridkv simulate --host-memory`` under ``hybrid`` demotes what the device
pool evicts. The pool evicts a cached block when its free set hands it out
for reuse (``EvictionPolicy.take``), and at that moment the block still has
its key and the class of its value (``free_class``). ``TakeRecorder`` wraps
the free set the policy chose (passed to ``KVCacheManager`` as its
``eviction_policy`` factory) and appends ``(group, hash, value)`` of each keyed
block it hands out to a list, the value being the cache policy's
``demotion_value`` (the engine's own decision, ``offload/demotion.py``: under
``hybrid`` the class of the run's value, ``SPARE`` for a run released
``evict_first``, which a tier takes only into spare room). The policy is built
after the free set, so ``value_of`` is set once it exists; until then (and for
a free set that knows no values) each block is worth 1.0. It changes no
decision: every call is the inner policy's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.eviction import EvictionPolicy, LRUEvictionPolicy

#: What a taken keyed block was: its group, hash and demotion value (None: not demoted).
Taken = tuple[int, bytes, float | None]


def _neutral(block: KVCacheBlock) -> float | None:
    return 1.0


class TakeRecorder(EvictionPolicy):
    """``inner``'s decisions, with each keyed block ``take`` hands out noted in
    ``sink`` with ``value_of(block)`` (``CachePolicy.demotion_value``, set by
    the replay once the policy exists; 1.0 until then)."""

    def __init__(self, inner: EvictionPolicy, sink: list[Taken]) -> None:
        self.inner = inner
        self.sink = sink
        self.value_of: Callable[[KVCacheBlock], float | None] = _neutral
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
        value_of = self.value_of
        for b in blocks:
            if b.block_hash is not None:
                assert b.group_id is not None
                sink.append((b.group_id, b.block_hash, value_of(b)))
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
        return TakeRecorder(inner(blocks), sink)

    return build
