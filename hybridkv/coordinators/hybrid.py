"""Coordinator for any number of groups of any kinds.

A hit of ``L`` tokens is usable only if it is valid for every group at once.
Each group answers "the longest valid hit of at most ``L``"; starting from
``L = max_length``, the coordinator lowers ``L`` to the shortest answer and
asks again until every group answers exactly ``L`` (a fixed point). ``L`` only
decreases, and any length valid for all groups stays below every answer, so
the fixed point is the longest common valid hit. Groups with
``prefix_closed`` rules (full attention) answer a smaller ``L`` by truncation;
they are asked first because they bound ``L`` cheaply.
"""

from __future__ import annotations

from hybridkv.coordinators.base import KVCacheCoordinator
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.policy import HybridOptions
from hybridkv.specs import KVCacheConfig


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Fixed-point intersection of per-group prefix hits."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        block_pool: BlockPool,
        hash_block_size: int,
        enable_caching: bool,
        cache_policy: str = "lru",
        hybrid: HybridOptions | None = None,
    ) -> None:
        super().__init__(
            kv_cache_config,
            block_pool,
            hash_block_size,
            enable_caching,
            cache_policy,
            hybrid,
        )
        order = sorted(
            range(len(self.managers)), key=lambda i: (not self.managers[i].prefix_closed, i)
        )
        self._order = order
        # Full-attention groups come first: after this many, ``length`` is where
        # they all match (the branch point, ``last_full_hit_tokens``).
        self._num_closed = sum(m.prefix_closed for m in self.managers)

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int, token_ids: list[int] | None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        managers = self.managers
        hits: list[list[KVCacheBlock] | None] = [None] * len(managers)
        views: dict[int, list[bytes]] = {}
        length = max_length
        full_hit: int | None = None
        closed = self._num_closed
        changed = True
        while changed:
            changed = False
            for k, gid in enumerate(self._order):
                if k == closed and full_hit is None and closed:
                    full_hit = length  # every full-attention group matches this far
                m = managers[gid]
                bs = m.block_size
                cur = hits[gid]
                if cur is not None and len(cur) * bs == length:
                    continue
                if cur is not None and m.prefix_closed:
                    cur = cur[: length // bs]
                else:
                    view = views.get(m.hash_stride)
                    if view is None:
                        view = views[m.hash_stride] = m.group_hashes(block_hashes)
                    cur = m.find_longest_cache_hit(view, length, token_ids)
                hits[gid] = cur
                if len(cur) * bs < length:
                    length = len(cur) * bs
                    changed = True
        # No full-attention group, or only those: the hit itself.
        self.last_full_hit_tokens = length if full_hit is None else full_hit
        return tuple(h if h is not None else [] for h in hits), length
