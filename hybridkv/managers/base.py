"""``SingleTypeKVCacheManager``: the block tables of one KV cache group.

The base class does all bookkeeping once; a layer kind only says which tokens
a query no longer needs (``get_num_skipped_tokens``). Everything follows:

- skipped blocks (wholly before the first needed token) are replaced by the
  null block in the table and released, so a running request holds only what
  its next query can read;
- a prefix hit of ``L`` tokens is valid iff every block from the first token
  needed at position ``L`` up to ``L`` is cached (``find_longest_cache_hit``
  returns the longest valid hit, null blocks before the needed range).

Block table of one request (``block_size`` 4, window 6, 13 computed tokens)::

    tokens   0123 4567 89ab c
    blocks   [ 0 ][ 7 ][ 9 ][ 4 ]      first needed token: 13 - 6 + 1 = 8
              ^null: tokens 0-7 are never read again, block freed

Table entries are never removed while the request lives (block tables are
append-only); ``free`` hands the whole table back to the coordinator, which
decides the release order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.specs.base import KVCacheSpec, cdiv


class SingleTypeKVCacheManager(ABC):
    """Block tables and prefix-hit rule for one group of one layer kind."""

    #: True when a valid hit of L tokens implies every shorter aligned hit is
    #: valid (full attention), so a hit can simply be truncated.
    prefix_closed: ClassVar[bool] = False

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        group_id: int,
        hash_block_size: int,
        enable_caching: bool,
    ) -> None:
        self.spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        if self.block_size % hash_block_size:
            raise ValueError(
                f"group {group_id}: block_size {self.block_size} is not a multiple of "
                f"the hash block size {hash_block_size}"
            )
        self.hash_stride = self.block_size // hash_block_size
        self.pool = block_pool
        self.group_id = group_id
        self.enable_caching = enable_caching
        self.null_block = block_pool.null_block
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.num_skipped_block: dict[str, int] = {}

    # -- the one rule a kind defines ----------------------------------------
    @abstractmethod
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens that the query at ``num_computed_tokens`` never reads.

        Must be non-decreasing in ``num_computed_tokens`` and at most it.
        """

    def _first_needed_block(self, num_tokens: int) -> int:
        return self.get_num_skipped_tokens(num_tokens) // self.block_size

    # -- allocation ----------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: list[KVCacheBlock],
        total_computed_tokens: int,
    ) -> int:
        """Net free blocks this step consumes: new blocks, plus hit blocks that
        leave the free set, minus skipped blocks that return to it."""
        blocks = self.req_to_blocks.get(request_id)
        have = len(new_computed_blocks) + (len(blocks) if blocks else 0)
        n = self._num_new_real_blocks(have, cdiv(num_tokens, self.block_size))
        for b in new_computed_blocks:
            if b.ref_cnt == 0 and not b.is_null:
                n += 1
        if blocks:
            start = self.num_skipped_block[request_id]
            stop = self._first_needed_block(total_computed_tokens)
            for i in range(start, min(stop, len(blocks))):
                b = blocks[i]
                if b.ref_cnt == 1 and not b.is_null:
                    n -= 1
        return n

    def _num_new_real_blocks(self, have: int, required: int) -> int:
        """Blocks to pop for table positions ``have .. required-1``."""
        return required - have if required > have else 0

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Null out and release blocks no query of this request reads again."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        start = self.num_skipped_block[request_id]
        stop = min(self._first_needed_block(total_computed_tokens), len(blocks))
        if stop <= start:
            return
        null = self.null_block
        removed = []
        for i in range(stop - 1, start - 1, -1):  # tail first
            b = blocks[i]
            if not b.is_null:
                removed.append(b)
                blocks[i] = null
        self.num_skipped_block[request_id] = stop
        self.pool.free_blocks(removed)

    def save_new_computed_blocks(
        self, request_id: str, new_computed_blocks: list[KVCacheBlock]
    ) -> None:
        """Adopt prefix-hit blocks (already touched) as the table's start."""
        if request_id in self.req_to_blocks:
            if new_computed_blocks:
                raise ValueError(f"request {request_id!r} already has blocks; hits are for new requests")
            return
        self.req_to_blocks[request_id] = list(new_computed_blocks)
        self.num_cached_block[request_id] = len(new_computed_blocks)
        skipped = 0
        for b in new_computed_blocks:
            if not b.is_null:
                break
            skipped += 1
        self.num_skipped_block[request_id] = skipped

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Extend the table to cover ``num_tokens``; returns the new entries."""
        blocks = self.req_to_blocks[request_id]
        required = cdiv(num_tokens, self.block_size)
        if required <= len(blocks):
            return []
        new = self.pool.get_new_blocks(required - len(blocks))
        blocks.extend(new)
        return new

    # -- prefix caching ------------------------------------------------------
    def cache_blocks(
        self, request_id: str, hashes: list[bytes], token_ids: list[int], num_tokens: int,
        lora_name: str | None = None,
    ) -> None:
        """Enter the full blocks covering ``num_tokens`` into the cache.

        ``hashes`` are this group's block hashes (``group_hashes``).
        """
        num_full = num_tokens // self.block_size
        start = self.num_cached_block[request_id]
        if num_full <= start:
            return
        blocks = self.req_to_blocks[request_id]
        bs = self.block_size
        pool = self.pool
        gid = self.group_id
        stored = []
        for i in range(start, num_full):
            b = blocks[i]
            if b.is_null or b.block_hash is not None:
                continue
            h = hashes[i]
            pool.cache_block(b, h, gid, token_ids[i * bs : (i + 1) * bs])
            stored.append(i)
        self.num_cached_block[request_id] = num_full
        if stored and pool.enable_kv_cache_events:
            first = stored[0]
            pool.record_stored(
                [hashes[i] for i in stored],
                hashes[first - 1] if first > 0 else None,
                [t for i in stored for t in token_ids[i * bs : (i + 1) * bs]],
                bs,
                lora_name,
                gid,
            )

    def group_hashes(self, block_hashes: list[bytes]) -> list[bytes]:
        """This group's block hashes from the request's hash-block-size hashes.

        Hashes are chained, so the hash of the last small block inside a big
        block commits to every token up to the big block's end.
        """
        k = self.hash_stride
        return block_hashes if k == 1 else block_hashes[k - 1 :: k]

    def _lookup(self, hashes: list[bytes], i: int, token_ids: list[int] | None) -> KVCacheBlock | None:
        if token_ids is None:
            return self.pool.cached[self.group_id].get(hashes[i])
        bs = self.block_size
        return self.pool.get_cached_block(hashes[i], self.group_id, token_ids[i * bs : (i + 1) * bs])

    def find_longest_cache_hit(
        self, hashes: list[bytes], max_length: int, token_ids: list[int] | None = None
    ) -> list[KVCacheBlock]:
        """Longest valid hit of at most ``max_length`` tokens. Read-only.

        Scans right to left: for a candidate end, the blocks from the first
        needed one up to the end must all be cached; a miss at block ``i``
        rules out every end above ``i`` (the needed range only grows with the
        end). Returns ``hit_length // block_size`` entries, null before the
        needed range. ``token_ids`` turns on the stored-token check.
        """
        end = min(max_length // self.block_size, len(hashes))
        found: list[KVCacheBlock] = []  # blocks end-1, end-2, ... verified so far
        i = end - 1
        while end > 0:
            first = self._first_needed_block(end * self.block_size)
            while i >= first:
                b = self._lookup(hashes, i, token_ids)
                if b is None:
                    break
                found.append(b)
                i -= 1
            else:
                found.reverse()
                return [self.null_block] * first + found
            end = i
            i = end - 1
            found = []
        return []

    # -- release -------------------------------------------------------------
    def pop_request(self, request_id: str) -> list[KVCacheBlock]:
        """Forget the request; return its table for the coordinator to free."""
        self.num_cached_block.pop(request_id, None)
        self.num_skipped_block.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    # -- integrity -----------------------------------------------------------
    def check_integrity(self) -> None:
        """Per-request tables are consistent with the counters and the pool."""
        for rid, blocks in self.req_to_blocks.items():
            cached = self.num_cached_block[rid]
            skipped = self.num_skipped_block[rid]
            assert 0 <= skipped <= len(blocks), f"{rid}: skipped {skipped} > {len(blocks)}"
            assert 0 <= cached <= len(blocks), f"{rid}: cached {cached} > {len(blocks)}"
            for i, b in enumerate(blocks):
                if i < skipped:
                    assert b.is_null, f"{rid}: block {i} should be null (skipped)"
                if b.is_null:
                    continue
                assert b.ref_cnt >= 1, f"{rid}: held block {b} has ref count 0"
                if i < cached and self.enable_caching:
                    assert b.block_hash is not None and b.group_id == self.group_id, (
                        f"{rid}: full block {i} ({b}) is not cached in group {self.group_id}"
                    )
