"""``BlockPool``: all blocks, their ref counts, and the prefix-cache index.

Storage (blocks, ref counts, the free set) and the prefix index (cache key ->
block) live together here because eviction must update both at once. Which
free block is reused next is the eviction policy's business.

Invariants (``check_integrity``):
- block 0 is the null block: never free, never cached, never handed out, never
  ref counted (its ref count stays 0);
- a block is free (in the policy) iff its ref count is 0;
- free + in-use blocks == ``num_blocks - 1``;
- a block has a hash iff the index maps ``(hash, group_id)`` to it, and the
  index holds nothing else. Several blocks may share one key (duplicates:
  block tables are append-only, so a later request may have computed the
  same block again); the index keeps one primary block and the duplicates.

Events describe the set of cached *keys*, not blocks: ``BlockStored`` when a
key enters the index (its first block), ``BlockRemoved`` when it leaves (its
last block is evicted or uncached). A duplicate's arrival or eviction, and the promotion
of a duplicate to primary, are silent. So a subscriber that adds stored keys
to a set and discards removed ones holds exactly the index's keys
(``cached_keys()``) after every drained batch (docs/kv_events.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hybridkv.core.block import KVCacheBlock, num_leading_nulls
from hybridkv.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from hybridkv.core.eviction import EvictionPolicy, LRUEvictionPolicy, PolicyFactory

#: ``BlockPool.on_stored``: ``record_stored``'s arguments (hashes, parent, tokens,
#: block size, LoRA name, group).
StoredHook = Callable[[list[bytes], bytes | None, list[int], int, "str | None", int], None]


class BlockPool:
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
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        #: Cached blocks keep their token ids (for ``get_cached_block``'s check,
        #: needed only with a non-cryptographic hash); else ``token_ids`` stays None.
        self.record_token_ids = record_token_ids
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        policy_cls = eviction_policy or LRUEvictionPolicy
        self.policy: EvictionPolicy = policy_cls(self.blocks[1:])
        # Prefix index: per group, hash -> primary block; duplicates apart.
        self.cached: list[dict[bytes, KVCacheBlock]] = [{} for _ in range(num_groups)]
        self.duplicates: dict[tuple[int, bytes], dict[int, KVCacheBlock]] = {}
        self.events: list[KVCacheEvent] = []
        #: Bumped whenever a cached block may have left the index (an eviction,
        #: an uncache, a reset): a prefix hit found at the same generation is
        #: still valid block for block.
        self.generation = 0
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
        #: Called with ``record_stored``'s arguments after its event (events on): a
        #: lower tier keeps what its own events will need; None: nothing.
        self.on_stored: (
            Callable[[list[bytes], bytes | None, list[int], int, str | None, int], None] | None
        ) = None

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

    def get_cached_block(
        self, block_hash: bytes, group_id: int, token_ids: list[int] | None = None
    ) -> KVCacheBlock | None:
        """The cached block for a key, or None. Does not modify the cache.

        With ``token_ids`` the block must also have recorded exactly those
        tokens (the collision check for non-cryptographic hashes).
        """
        block = self.cached[group_id].get(block_hash)
        if block is None or token_ids is None or block.token_ids == token_ids:
            return block
        for dup in self.duplicates.get((group_id, block_hash), {}).values():
            if dup.token_ids == token_ids:
                return dup
        return None

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

    # -- the prefix index ----------------------------------------------------
    def cache_run(
        self,
        blocks: list[KVCacheBlock],
        hashes: list[bytes],
        group_id: int,
        token_ids: list[int],
        block_size: int,
        start: int,
        stop: int,
    ) -> list[int]:
        """Enter ``blocks[start:stop]`` (full and computed) into the index: block
        ``i`` under ``hashes[i]`` with tokens ``token_ids[i * block_size:][:block_size]``.

        Null blocks and blocks already cached are skipped; a block under a key
        already cached becomes a duplicate. With events on, returns the
        indices whose keys were new to the index (each block is then its
        key's primary: the ``BlockStored`` runs); else an empty list.
        """
        claim = self.cached[group_id].setdefault
        duplicates = self.duplicates
        record = self.record_token_ids
        if not record and not self.enable_kv_cache_events:  # the common loop, lean
            for b, h in zip(blocks[start:stop], hashes[start:stop], strict=True):
                if b.block_hash is None and not b.is_null:
                    b.block_hash = h
                    b.group_id = group_id
                    if claim(h, b) is not b:
                        duplicates.setdefault((group_id, h), {})[b.block_id] = b
            return []
        new: list[int] = []
        i = start
        for b, h in zip(blocks[start:stop], hashes[start:stop], strict=True):
            if b.block_hash is None and not b.is_null:
                b.block_hash = h
                b.group_id = group_id
                if record:
                    b.token_ids = token_ids[i * block_size : (i + 1) * block_size]
                if claim(h, b) is b:  # the key was new: b is its primary
                    new.append(i)
                else:
                    duplicates.setdefault((group_id, h), {})[b.block_id] = b
            i += 1
        return new if self.enable_kv_cache_events else []

    def uncache(self, block: KVCacheBlock) -> None:
        """Take a block in use out of the prefix index (its content is not
        valid, e.g. the step that was to compute it failed); no-op if uncached."""
        if block.ref_cnt <= 0:
            raise ValueError(f"{block} is free: only a block in use can be uncached")
        if block.block_hash is not None:
            self._evict(block)

    def _evict(self, block: KVCacheBlock) -> None:
        h, gid = block.block_hash, block.group_id
        assert h is not None and gid is not None
        self.generation += 1
        index = self.cached[gid]
        key = (gid, h)
        if index.get(h) is block:
            dups = self.duplicates.get(key)
            if dups:
                _, promoted = dups.popitem()
                index[h] = promoted
                if not dups:
                    del self.duplicates[key]
            else:
                del index[h]  # the key's last block: the key leaves the index
                if self.enable_kv_cache_events:
                    self.events.append(BlockRemoved(block_hashes=[h], group_id=gid))
        else:
            dups = self.duplicates[key]
            del dups[block.block_id]
            if not dups:
                del self.duplicates[key]
        block.block_hash = None
        block.group_id = None
        block.token_ids = None

    def record_stored(
        self,
        hashes: list[bytes],
        parent: bytes | None,
        token_ids: list[int],
        block_size: int,
        lora_name: str | None,
        group_id: int,
    ) -> None:
        """Emit a ``BlockStored`` event for keys new to the index (events enabled).

        ``hashes`` are consecutive blocks of one request's chain; ``parent``
        is the hash of the block before the first (None for block 0) and
        ``token_ids`` the tokens of exactly these blocks.
        """
        self.events.append(
            BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=token_ids,
                block_size=block_size,
                lora_name=lora_name,
                group_id=group_id,
            )
        )
        if self.on_stored is not None:
            self.on_stored(hashes, parent, token_ids, block_size, lora_name, group_id)

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

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the collected events."""
        events, self.events = self.events, []
        return events

    def cached_keys(self) -> set[tuple[int, bytes]]:
        """The ``(group_id, hash)`` keys in the index (what events mirror). Read-only."""
        return {(gid, h) for gid, index in enumerate(self.cached) for h in index}

    def num_cached_blocks(self) -> int:
        """Blocks currently in the prefix index (primary and duplicates)."""
        return sum(len(i) for i in self.cached) + sum(len(d) for d in self.duplicates.values())

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
        indexed: set[int] = set()
        for gid, index in enumerate(self.cached):
            for h, b in index.items():
                assert b.block_hash == h and b.group_id == gid, f"index key mismatch for {b}"
                assert b.block_id not in indexed, f"{b} indexed twice"
                indexed.add(b.block_id)
        for (gid, h), dups in self.duplicates.items():
            assert dups, "empty duplicate entry"
            assert h in self.cached[gid], "duplicate without a primary block"
            for bid, b in dups.items():
                assert b.block_id == bid and b.block_hash == h and b.group_id == gid
                assert b.block_id not in indexed, f"{b} indexed twice"
                indexed.add(b.block_id)
        for b in self.blocks:
            assert (b.block_hash is not None) == (b.block_id in indexed), (
                f"{b}: hash set but not indexed, or indexed without hash"
            )
            if b.block_hash is not None:
                assert (b.token_ids is not None) == self.record_token_ids, (
                    f"{b}: token ids recorded {b.token_ids is not None}, "
                    f"expected {self.record_token_ids}"
                )
