"""``KVCacheCoordinator``: drives every group's manager as one.

The coordinator makes multi-group operations atomic (count first, then act)
and defines the cross-group release order. Subclasses differ only in how a
prefix hit is found across groups.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.managers import SingleTypeKVCacheManager, get_manager_for_kv_cache_spec
from hybridkv.specs import KVCacheConfig


class KVCacheCoordinator(ABC):
    """All groups' managers over one block pool."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        block_pool: BlockPool,
        hash_block_size: int,
        enable_caching: bool,
    ) -> None:
        self.pool = block_pool
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.managers: list[SingleTypeKVCacheManager] = [
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec, block_pool, gid, hash_block_size, enable_caching
            )
            for gid, g in enumerate(kv_cache_config.kv_cache_groups)
        ]
        sizes = {m.block_size for m in self.managers}
        self._same_block_size = len(sizes) == 1

    # -- allocation (atomic across groups) -----------------------------------
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[list[KVCacheBlock], ...],
        total_computed_tokens: int,
    ) -> int:
        """Net free blocks the whole step consumes (see the managers)."""
        return sum(
            m.get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks[i], total_computed_tokens
            )
            for i, m in enumerate(self.managers)
        )

    def allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[list[KVCacheBlock], ...] | None,
        total_computed_tokens: int,
    ) -> tuple[list[KVCacheBlock], ...]:
        """Release skipped blocks, adopt hits, extend tables. The caller has
        checked that the net count fits; returns each group's new blocks."""
        for m in self.managers:
            m.remove_skipped_blocks(request_id, total_computed_tokens)
        if new_computed_blocks is not None:
            for blocks in new_computed_blocks:
                self.pool.touch(blocks)
            for i, m in enumerate(self.managers):
                m.save_new_computed_blocks(request_id, new_computed_blocks[i])
        else:
            for m in self.managers:
                if request_id not in m.req_to_blocks:
                    m.save_new_computed_blocks(request_id, [])
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.managers)

    def cache_blocks(
        self,
        request_id: str,
        block_hashes: list[bytes],
        token_ids: list[int],
        num_tokens: int,
        lora_name: str | None,
    ) -> None:
        """Cache every group's full blocks covering ``num_tokens``."""
        for m in self.managers:
            m.cache_blocks(
                request_id, m.group_hashes(block_hashes), token_ids, num_tokens, lora_name
            )

    # -- prefix hits ---------------------------------------------------------
    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int, token_ids: list[int] | None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest hit valid for every group, and its length. Read-only."""

    # -- release -------------------------------------------------------------
    def free(self, request_id: str) -> bool:
        """Release all of a request's blocks, tail first; False if unknown.

        Across groups, blocks are released by token position, last first (for
        equal block sizes: position ``i`` of every group, then ``i - 1``...),
        so every group's tail is evicted before any group's prefix.
        """
        if request_id not in self.managers[0].req_to_blocks:
            return False
        tables = [m.pop_request(request_id) for m in self.managers]
        if len(tables) == 1:
            self.pool.free_blocks(reversed(tables[0]))
        elif self._same_block_size:
            longest = max(len(t) for t in tables)
            order = [
                t[i] for i in range(longest - 1, -1, -1) for t in tables if i < len(t)
            ]
            self.pool.free_blocks(order)
        else:
            keyed = [
                ((i + 1) * m.block_size, gid, b)
                for gid, (m, t) in enumerate(zip(self.managers, tables, strict=True))
                for i, b in enumerate(t)
            ]
            keyed.sort(key=lambda e: (-e[0], e[1]))
            self.pool.free_blocks(b for _, _, b in keyed)
        return True

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        """Each group's block table of the request (empty if unknown)."""
        return tuple(m.req_to_blocks.get(request_id, []) for m in self.managers)

    def has_request(self, request_id: str) -> bool:
        """True while the request holds tables."""
        return request_id in self.managers[0].req_to_blocks

    def check_integrity(self) -> None:
        """Every manager's tables; all groups know the same requests."""
        ids = set(self.managers[0].req_to_blocks)
        for m in self.managers:
            assert set(m.req_to_blocks) == ids, "groups disagree on the live requests"
            m.check_integrity()
