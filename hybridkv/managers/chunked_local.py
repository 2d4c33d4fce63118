"""Chunked local attention: positions p and q interact iff ``p // C == q // C``.

The query at ``n`` reads only its own chunk, from ``(n // C) * C``: blocks of
finished chunks are freed, and a hit ending at a chunk boundary needs nothing
cached in this group (its chunk has not started).
"""

from __future__ import annotations

from hybridkv.core.block_pool import BlockPool
from hybridkv.managers.base import RequestBlockState, SingleTypeKVCacheManager
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
    ) -> None:
        super().__init__(kv_cache_spec, block_pool, group_id, hash_block_size, enable_caching)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def free_point_period(self) -> int:
        """A hit at a chunk boundary needs none of this group's blocks."""
        return self.attention_chunk_size

    #: Set by the coordinator (``hybrid``): hold only the current chunk while
    #: running (``release_stop``).
    current_chunk_only = False

    def release_stop(self, st: RequestBlockState, total_computed_tokens: int) -> int:
        """With ``current_chunk_only``, as under ``lru``: a running request holds
        only its current chunk. The generic ``hybrid`` rule holds what the last
        hit boundary below the tail needs, which for the first ``tail`` tokens
        of each chunk is the whole previous chunk (8,192 tokens at Llama 4
        Scout's size, per prefilling request: ``hybrid`` preempted 2.8x as
        often as ``lru``). The coordinator sets it when every group but full
        attention is chunked (a tail point then has no block of its own that a
        missing chunk would strand) and chunks start on the hit step (so the
        end point ``E`` is never in an earlier chunk: it stays whole)."""
        if self.current_chunk_only:
            return min(self.first_needed_block(total_computed_tokens), len(st.blocks))
        return super().release_stop(st, total_computed_tokens)

    def next_release_at(self, st: RequestBlockState) -> int:
        if self.current_chunk_only:
            return self.min_tokens_skipping((st.num_skipped + 1) * self.block_size)
        return super().next_release_at(st)

    def min_tokens_skipping(self, num_skipped: int) -> int:
        c = self.attention_chunk_size
        return -(-num_skipped // c) * c
