"""How ``KVCacheManager`` puts its pool and coordinator together.

The block pool gets the free set's ranking (the cache policy's,
``hybridkv.policy.eviction_factory``, unless the caller passes its own), and
the coordinator is built over that pool with the cache policy and its
settings. Nothing here decides what to keep: that is the policy's.
"""

from __future__ import annotations

from hybridkv.coordinators import KVCacheCoordinator, get_kv_cache_coordinator
from hybridkv.core.block_pool import BlockPool
from hybridkv.core.eviction import PolicyFactory
from hybridkv.policy import HybridOptions, eviction_factory
from hybridkv.specs import KVCacheConfig


def build_cache(
    kv_cache_config: KVCacheConfig,
    hash_block_size: int,
    *,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    record_token_ids: bool,
    eviction_policy: PolicyFactory | None,
    cache_policy: str,
    options: HybridOptions,
) -> tuple[BlockPool, KVCacheCoordinator]:
    """The pool of ``kv_cache_config.num_blocks`` blocks and the coordinator
    of its groups. ``eviction_policy`` (a free-set class or factory) overrides
    the policy's ranking: under ``hybrid`` free blocks are ranked by recency
    and value, unless every group is full attention (then it decides exactly
    as ``lru``)."""
    groups = kv_cache_config.kv_cache_groups
    if eviction_policy is None:
        specs = [g.kv_cache_spec for g in groups]
        eviction_policy = eviction_factory(cache_policy, options, specs, enable_caching)
    pool = BlockPool(
        kv_cache_config.num_blocks,
        len(groups),
        enable_caching=enable_caching,
        enable_kv_cache_events=enable_kv_cache_events,
        eviction_policy=eviction_policy,
        record_token_ids=record_token_ids,
    )
    coordinator = get_kv_cache_coordinator(
        kv_cache_config, pool, hash_block_size, enable_caching, cache_policy, options
    )
    return pool, coordinator
