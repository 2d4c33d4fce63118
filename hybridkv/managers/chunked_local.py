"""Chunked local attention: positions p and q interact iff ``p // C == q // C``.

The query at ``n`` reads only its own chunk, from ``(n // C) * C``: blocks of
finished chunks are freed, and a hit ending at a chunk boundary needs nothing
cached in this group (its chunk has not started).
"""

from __future__ import annotations

from hybridkv.core.block_pool import BlockPool
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.managers.points import Hold
from hybridkv.specs.attention import ChunkedLocalAttentionSpec


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Block tables of a chunked-local-attention group."""

    def __init__(
        self,
        kv_cache_spec: ChunkedLocalAttentionSpec,
        block_pool: BlockPool,
        group_id: int,
        hash_block_size: int,
        enable_caching: bool,
        hold: Hold | None = None,
    ) -> None:
        super().__init__(kv_cache_spec, block_pool, group_id, hash_block_size, enable_caching, hold)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def free_point_period(self) -> int:
        """A hit at a chunk boundary needs none of this group's blocks."""
        return self.attention_chunk_size

    def min_tokens_skipping(self, num_skipped: int) -> int:
        c = self.attention_chunk_size
        return -(-num_skipped // c) * c
