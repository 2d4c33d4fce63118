"""Coordinator for a single group: the group's own rule is the answer."""

from __future__ import annotations

from hybridkv.coordinators.base import KVCacheCoordinator
from hybridkv.core.block import KVCacheBlock


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Exactly one group, prefix caching on."""

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int, token_ids: list[int] | None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        m = self.managers[0]
        blocks = m.find_longest_cache_hit(m.group_hashes(block_hashes), max_length, token_ids)
        return (blocks,), len(blocks) * m.block_size
