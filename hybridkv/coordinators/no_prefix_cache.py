"""Coordinator with prefix caching off: nothing is ever hit or cached."""

from __future__ import annotations

from hybridkv.coordinators.base import KVCacheCoordinator
from hybridkv.core.block import KVCacheBlock


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Any number of groups; hits are always empty."""

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int, token_ids: list[int] | None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        return tuple([] for _ in self.managers), 0

    def cache_blocks(
        self,
        request_id: str,
        block_hashes: list[bytes],
        token_ids: list[int],
        num_tokens: int,
        lora_name: str | None,
    ) -> None:
        raise AssertionError("cache_blocks called with prefix caching disabled")
