"""Sliding-window attention: query q reads keys ``q - W < k <= q``.

The query at position ``n`` reads from ``n - W + 1``, so the first
``n - W + 1`` tokens are skipped: a long generation holds about
``W / block_size + 1`` blocks. A hit of ``L`` tokens needs only the ``W - 1``
tokens before ``L`` to be cached.
"""

from __future__ import annotations

from hybridkv.core.block_pool import BlockPool
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.managers.points import Hold
from hybridkv.specs.attention import SlidingWindowSpec


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Block tables of a sliding-window group."""

    def __init__(
        self,
        kv_cache_spec: SlidingWindowSpec,
        block_pool: BlockPool,
        group_id: int,
        hash_block_size: int,
        enable_caching: bool,
        hold: Hold | None = None,
    ) -> None:
        super().__init__(kv_cache_spec, block_pool, group_id, hash_block_size, enable_caching, hold)
        self.sliding_window = kv_cache_spec.sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def min_tokens_skipping(self, num_skipped: int) -> int:
        return num_skipped + self.sliding_window - 1
