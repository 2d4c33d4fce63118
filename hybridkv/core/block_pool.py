"""``BlockPool``: all blocks, their ref counts and the free set; the prefix index on them.

Storage (blocks, ref counts, the free set) and the prefix index (cache key ->
block, ``prefix_index.PrefixIndex``, which ``BlockPool`` is) are one object
because eviction must update both at once: taking a free block evicts it from
the index (``_claim``). Which free block is reused next is the eviction
policy's business.

Invariants (``check_integrity``):
- block 0 is the null block: never free, never cached, never handed out, never
  ref counted (its ref count stays 0);
- a block is free (in the policy) iff its ref count is 0;
- free + in-use blocks == ``num_blocks - 1``;
- the index's (``PrefixIndex.check_index``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hybridkv.core.block import KVCacheBlock, num_leading_nulls
from hybridkv.core.events import AllBlocksCleared
from hybridkv.core.eviction import EvictionPolicy, LRUEvictionPolicy, PolicyFactory
from hybridkv.core.prefix_index import PrefixIndex


class BlockPool(PrefixIndex):
    """Blocks ``0 .. num_blocks-1``; block 0 is the reserved null block."""

    def __init__(
        self,
        num_blocks: int,
        num_groups: int,
        *,
        enable_caching: bool = True,
        enable_kv_cache_events: bool = False,
        eviction_policy: PolicyFactory | None = None,
        record_token_ids: bool = True,
    ) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}"
            )
        super().__init__(
            num_groups,
            enable_kv_cache_events=enable_kv_cache_events,
            record_token_ids=record_token_ids,
        )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        policy_cls = eviction_policy or LRUEvictionPolicy
        self.policy: EvictionPolicy = policy_cls(self.blocks[1:])
        #: Cached blocks evicted so far: taken by ``get_new_blocks`` while their key (or
        #: duplicate) was in the index. An ``uncache`` or a reset is not an eviction.
        #: A statistic (benchmarks read it); nothing decides on it.
        self.num_evicted_blocks = 0
        #: Called with the blocks ``get_new_blocks`` takes, before any cached one
        #: leaves the index (a lower tier demotes them, ``hybridkv.offload``); None: nothing.
        self.on_take: Callable[[list[KVCacheBlock]], None] | None = None
        #: Called with the cached blocks ``free_blocks`` just freed (ref count 0, in the
        #: free set, the policy's release value on them): a store shared by replicas
        #: writes them (``hybridkv.offload``); None: nothing.
        self.on_free: Callable[[list[KVCacheBlock]], None] | None = None

    # -- queries -------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free, cached or not)."""
        return self.policy.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks (excluding the null block) in use."""
        usable = self.num_blocks - 1
        return 1.0 - self.policy.num_free_blocks / usable

    # -- allocation ----------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Pop ``n`` free blocks (evicting cached ones), each with ref count 1.
        The caller checked ``n <= num_free_blocks``."""
        blocks = self.policy.take(n)
        if self.on_take is not None:
            self.on_take(blocks)
        self._claim(blocks)
        return blocks

    def get_new_blocks_each(self, counts: list[int]) -> list[list[KVCacheBlock]]:
        """``[get_new_blocks(n) if n else [] for n in counts]`` in one eviction pass
        (``EvictionPolicy.take_each``; a take reads only the free set's order, never
        the index, so the blocks are the same). Exactly that list under an ``on_take``."""
        if self.on_take is not None:
            return [self.get_new_blocks(n) if n else [] for n in counts]
        out = self.policy.take_each(counts)
        self._claim([b for blocks in out for b in blocks])
        return out

    def _claim(self, blocks: list[KVCacheBlock]) -> None:
        """Blocks just taken leave the index (cached ones are evicted), ref count 1."""
        cached, duplicates = self.cached, self.duplicates
        events = self.enable_kv_cache_events
        evicted = 0
        for b in blocks:
            h = b.block_hash
            if h is not None:
                evicted += 1
                if events or (duplicates and (b.group_id, h) in duplicates):
                    self._evict(b)  # an event to send, or a duplicate to promote
                else:  # the common case inline: the key's only block
                    del cached[b.group_id][h]  # type: ignore[index]
                    b.block_hash = b.group_id = b.token_ids = None
            b.ref_cnt = 1
        if not events:  # with events, ``_evict`` counted each one
            self.generation += evicted
        self.num_evicted_blocks += evicted

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A hit: ref count + 1; blocks that were free leave the free set.

        The null block is never counted: its ref count stays 0.
        """
        remove = self.policy.remove
        if isinstance(blocks, list) and blocks and blocks[0] is self.null_block:
            blocks = blocks[num_leading_nulls(blocks, self.null_block) :]
        for b in blocks:
            if b.ref_cnt == 0:
                if b.is_null:
                    continue
                remove(b)
            b.ref_cnt += 1

    def free_blocks(
        self,
        ordered_blocks: Iterable[KVCacheBlock],
        *,
        evict_first: bool = False,
        value: float | None = None,
    ) -> None:
        """Ref count - 1, in the given (release) order; null blocks ignored.

        ``evict_first``: blocks that become free are reused before any other
        (no kept hit point needs them), cached or not. ``value``: what the
        blocks' hit unit saves per page (``EvictionPolicy.release``).
        """
        released = []
        for b in ordered_blocks:
            n = b.ref_cnt
            if n > 1:
                b.ref_cnt = n - 1
            elif n == 1:
                b.ref_cnt = 0
                released.append(b)
            elif not b.is_null:  # the null block is never counted; any other is a bug
                raise AssertionError(f"{b} is freed more often than it was taken")
        if released:
            self._release(released, evict_first, value)

    def free_held_blocks(
        self,
        ordered_blocks: list[KVCacheBlock],
        *,
        evict_first: bool = False,
        value: float | None = None,
    ) -> None:
        """``free_blocks`` of blocks only their freeing request holds (every
        ref count 1, none null, each once: a cache policy's plan says so), in
        one pass: each becomes free."""
        for b in ordered_blocks:
            b.ref_cnt = 0
        if ordered_blocks:
            self._release(ordered_blocks, evict_first, value)

    def _release(self, blocks: list[KVCacheBlock], evict_first: bool, value: float | None) -> None:
        """Hand blocks that became free to the free set."""
        if evict_first:
            self.policy.release(blocks, evict_first=True)
        elif value is not None:
            self.policy.release(blocks, value=value)
        else:  # policies written before ``evict_first`` keep working under lru
            self.policy.release(blocks)
        if self.on_free is not None:
            self.on_free(blocks)

    # -- reset ---------------------------------------------------------------
    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; only when no block is in use. Returns success."""
        if self.policy.num_free_blocks != self.num_blocks - 1:
            return False
        for b in self.blocks:
            b.block_hash = None
            b.group_id = None
            b.token_ids = None
        for index in self.cached:
            index.clear()
        self.duplicates.clear()
        self.generation += 1
        if self.enable_kv_cache_events:
            self.events.append(AllBlocksCleared())
        return True

    # -- integrity -----------------------------------------------------------
    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring."""
        self.policy.check_integrity()
        null = self.null_block
        assert null.is_null and null.block_hash is None, "null block was cached"
        assert null.prev_free is None and null.next_free is None, "null block is free"
        assert null.ref_cnt == 0, f"null block ref count {null.ref_cnt}: it is never counted"
        free = list(self.policy)
        assert len(free) == self.policy.num_free_blocks
        free_ids = {b.block_id for b in free}
        assert len(free_ids) == len(free), "a block is twice in the free set"
        assert 0 not in free_ids, "null block in the free set"
        for b in self.blocks[1:]:
            assert b.ref_cnt >= 0, f"negative ref count on {b}"
            assert (b.ref_cnt == 0) == (b.block_id in free_ids), (
                f"{b}: free-set membership does not match ref count"
            )
        self.check_index(self.blocks)
