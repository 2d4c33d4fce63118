"""Full attention: every earlier token is read, so no block is ever skipped."""

from __future__ import annotations

from typing import ClassVar

from hybridkv.core.block import KVCacheBlock
from hybridkv.managers.base import SingleTypeKVCacheManager


class FullAttentionManager(SingleTypeKVCacheManager):
    """Hits scan left to right and stop at the first miss."""

    prefix_closed: ClassVar[bool] = True
    has_skips: ClassVar[bool] = False

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def find_longest_cache_hit(
        self, hashes: list[bytes], max_length: int, token_ids: list[int] | None = None
    ) -> list[KVCacheBlock]:
        n = min(max_length // self.block_size, len(hashes))
        out: list[KVCacheBlock] = []
        if token_ids is None:
            get = self.pool.cached[self.group_id].get
            for i in range(n):
                b = get(hashes[i])
                if b is None:
                    break
                out.append(b)
            return out
        for i in range(n):
            found = self._lookup(hashes, i, token_ids)
            if found is None:
                break
            out.append(found)
        return out
