"""``ReleaseLog``: the state machine's watch on dead blocks under ``hybrid``.

A cached block is *dead* when no valid prefix hit uses it
(``reference.usable_keys``, computed from the cached token prefixes alone).
The invariant "no block stays cached that no valid hit could use once the
pool is under pressure" is checked in two parts:

- (R) a cached block that is dead when its ref count reaches 0 is released
  ``evict_first``;
- (P) once the pool evicts a cached block released *without* ``evict_first``
  (one worth keeping: the pool is under pressure), no block that was dead
  when it became free is still cached.

Both rest only on the ``EvictionPolicy`` contract (``evict_first`` blocks are
reused before every other free block), not on the order among the others
(LRU, or a cost-aware score). Not covered: a block usable when it became
free that turns dead later, when the pool evicts a block its hits need.

``ReleaseLog`` wraps the pool's policy (every call is passed through) and
records, per block, how it last became free; violations collect in
``problems`` for the state machine to assert on after each step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.eviction import EvictionPolicy


class ReleaseLog:
    """An eviction policy, watched. ``is_dead(blocks)``: which blocks are cached
    and dead now (the pool's cache does not change during a release)."""

    def __init__(
        self, policy: EvictionPolicy, is_dead: Callable[[list[KVCacheBlock]], list[bool]]
    ) -> None:
        self.policy = policy
        self.is_dead = is_dead
        #: block id -> (released evict_first, dead when released), at its last release.
        self.released: dict[int, tuple[bool, bool]] = {}
        self.problems: list[str] = []
        self.kept_evictions = 0  # evictions of blocks released as worth keeping
        self.seen_dead = False  # a block was dead when it became free

    def release(
        self, blocks: Iterable[KVCacheBlock], *, evict_first: bool = False, **kwargs: Any
    ) -> None:
        blocks = list(blocks)
        for b, dead in zip(blocks, self.is_dead(blocks), strict=True):
            self.released[b.block_id] = (evict_first, dead)
            self.seen_dead |= dead
            if dead and not evict_first:
                self.problems.append(f"(R) dead {b} released without evict_first")
        if evict_first:
            self.policy.release(blocks, evict_first=True, **kwargs)
        else:
            self.policy.release(blocks, **kwargs)

    def take(self, n: int) -> list[KVCacheBlock]:
        out = self.policy.take(n)
        kept = [
            b
            for b in out
            if b.block_hash is not None and not self.released.get(b.block_id, (True, False))[0]
        ]
        if kept:
            self.kept_evictions += 1
            stale = [
                b
                for b in self.policy
                if b.block_hash is not None and self.released.get(b.block_id, (False, False))[1]
            ]
            if stale:
                self.problems.append(
                    f"(P) evicted {kept} (released as worth keeping) while {stale} "
                    "(dead when freed) stay cached"
                )
        return out

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self.policy)

    def __getattr__(self, name: str) -> Any:  # num_free_blocks, remove, check_integrity...
        return getattr(self.policy, name)
