"""``LruPolicy``: every computed block is cached; the least recently used goes first.

vLLM's decisions: running requests hold only what their next query reads,
nothing is kept for later beyond the prefix cache itself, and a freed
request's blocks return tail first, so every group's tail is evicted before
any group's prefix.
"""

from __future__ import annotations

from itertools import chain, zip_longest

from hybridkv.core.block import KVCacheBlock
from hybridkv.policy.base import CachePolicy, ReleaseRun, Tables


class LruPolicy(CachePolicy):
    """Recency only (module docstring). ``null_block``: the pool's."""

    name = "lru"
    keeps_points = False

    def __init__(self, null_block: KVCacheBlock, same_block_size: bool) -> None:
        self._null = null_block
        self._same_block_size = same_block_size

    def release(
        self,
        request_id: str,
        tables: Tables,
        block_hashes: list[bytes] | None,
        num_tokens: int | None,
    ) -> list[ReleaseRun]:
        """Across groups, by token position, last first (for equal block sizes:
        position ``i`` of every group, then ``i - 1``...)."""
        rows = [st.blocks[st.num_skipped :] for _, st in tables]
        if len(rows) == 1:
            return [ReleaseRun(rows[0][::-1])]
        if self._same_block_size:
            # Tables of equal block size all end at the same position.
            cols = zip_longest(*[reversed(t) for t in rows], fillvalue=self._null)
            return [ReleaseRun(list(chain.from_iterable(cols)))]
        keyed = [
            ((i + 1) * m.block_size, gid, b)
            for gid, (m, st) in enumerate(tables)
            for i, b in enumerate(st.blocks)
        ]
        keyed.sort(key=lambda e: (-e[0], e[1]))
        return [ReleaseRun([b for _, _, b in keyed])]

    def check_integrity(self, live: set[str]) -> None:
        """Nothing to check: the policy keeps no state."""
