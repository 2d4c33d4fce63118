"""``PrefixIndex``: the prefix cache's index, ``(hash, group_id) -> block``, and its events.

``BlockPool`` is a ``PrefixIndex``: storage and index stay one object because
taking a free block must evict it from the index in the same step
(``BlockPool._claim``), but the index's rules live here.

Invariants (``check_index``):
- a block has a hash iff the index maps ``(hash, group_id)`` to it, and the
  index holds nothing else. Several blocks may share one key (duplicates:
  block tables are append-only, so a later request may have computed the
  same block again); the index keeps one primary block and the duplicates;
- a cached block holds its token ids iff ``record_token_ids``.

Events describe the set of cached *keys*, not blocks: ``BlockStored`` when a
key enters the index (its first block), ``BlockRemoved`` when it leaves (its
last block is evicted or uncached). A duplicate's arrival or eviction, and the promotion
of a duplicate to primary, are silent. So a subscriber that adds stored keys
to a set and discards removed ones holds exactly the index's keys
(``cached_keys()``) after every drained batch (docs/kv_events.md).
"""

from __future__ import annotations

from collections.abc import Callable

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.events import BlockRemoved, BlockStored, KVCacheEvent

#: ``BlockPool.on_stored``: ``record_stored``'s arguments (hashes, parent, tokens,
#: block size, LoRA name, group).
StoredHook = Callable[[list[bytes], bytes | None, list[int], int, "str | None", int], None]


class PrefixIndex:
    """Per group, hash -> primary block; duplicates apart; the events of its keys."""

    def __init__(
        self, num_groups: int, *, enable_kv_cache_events: bool, record_token_ids: bool
    ) -> None:
        self.enable_kv_cache_events = enable_kv_cache_events
        #: Cached blocks keep their token ids (for ``get_cached_block``'s check,
        #: needed only with a non-cryptographic hash); else ``token_ids`` stays None.
        self.record_token_ids = record_token_ids
        self.cached: list[dict[bytes, KVCacheBlock]] = [{} for _ in range(num_groups)]
        self.duplicates: dict[tuple[int, bytes], dict[int, KVCacheBlock]] = {}
        self.events: list[KVCacheEvent] = []
        #: Bumped whenever a cached block may have left the index (an eviction,
        #: an uncache, a reset): a prefix hit found at the same generation is
        #: still valid block for block.
        self.generation = 0
        #: Called with ``record_stored``'s arguments after its event (events on): a
        #: lower tier keeps what its own events will need; None: nothing.
        self.on_stored: StoredHook | None = None

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

    def check_index(self, blocks: list[KVCacheBlock]) -> None:
        """Assert the invariants in the module docstring over all ``blocks``."""
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
        for b in blocks:
            assert (b.block_hash is not None) == (b.block_id in indexed), (
                f"{b}: hash set but not indexed, or indexed without hash"
            )
            if b.block_hash is not None:
                assert (b.token_ids is not None) == self.record_token_ids, (
                    f"{b}: token ids recorded {b.token_ids is not None}, "
                    f"expected {self.record_token_ids}"
                )
