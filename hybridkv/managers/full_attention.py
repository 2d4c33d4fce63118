"""Full attention: every earlier token is read, so no block is ever skipped."""

from __future__ import annotations

from typing import ClassVar

from hybridkv.core.block import KVCacheBlock
from hybridkv.managers.base import SingleTypeKVCacheManager

#: Blocks looked up per slice of a hit scan (a miss wastes at most this many).
_SCAN_SLICE = 64


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
        if token_ids is None:
            # Looked up in C, a slice at a time: stop at the first miss.
            get = self.pool.cached[self.group_id].get
            hit: list[KVCacheBlock | None] = []
            for lo in range(0, n, _SCAN_SLICE):
                part = list(map(get, hashes[lo : min(lo + _SCAN_SLICE, n)]))
                if None in part:
                    hit += part[: part.index(None)]
                    break
                hit += part
            return hit  # type: ignore[return-value]  # no None before the first miss
        out: list[KVCacheBlock] = []
        for i in range(n):
            found = self._lookup(hashes, i, token_ids)
            if found is None:
                break
            out.append(found)
        return out
