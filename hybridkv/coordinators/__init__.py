"""Coordinators: make every group's manager act as one."""

from __future__ import annotations

from hybridkv.coordinators.base import KVCacheCoordinator
from hybridkv.coordinators.hybrid import HybridKVCacheCoordinator
from hybridkv.coordinators.no_prefix_cache import KVCacheCoordinatorNoPrefixCache
from hybridkv.coordinators.unitary import UnitaryKVCacheCoordinator
from hybridkv.core.block_pool import BlockPool
from hybridkv.policy import HybridOptions
from hybridkv.specs import KVCacheConfig


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    block_pool: BlockPool,
    hash_block_size: int,
    enable_caching: bool,
    cache_policy: str = "lru",
    hybrid: HybridOptions | None = None,
) -> KVCacheCoordinator:
    """No-prefix-cache, unitary (one group) or hybrid (several groups), steered
    by ``cache_policy`` (``hybrid``: its settings)."""
    cls: type[KVCacheCoordinator]
    if not enable_caching:
        cls = KVCacheCoordinatorNoPrefixCache
    elif len(kv_cache_config.kv_cache_groups) == 1:
        cls = UnitaryKVCacheCoordinator
    else:
        cls = HybridKVCacheCoordinator
    return cls(
        kv_cache_config,
        block_pool,
        hash_block_size,
        enable_caching,
        cache_policy,
        hybrid,
    )


__all__ = [
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
]
