"""The cache policy: every decision about what to keep and what to let go first.

``CachePolicy`` (``base.py``) is the interface the coordinator calls;
``LruPolicy`` (vLLM's decisions) and ``HybridPolicy`` (kept hit points,
cost-aware ranking, online learners) implement it. ``HybridOptions`` and
``HybridTuning`` are their settings; ``eviction_factory`` builds the free
set's ranking for the block pool, ``make_policy`` the policy for a
coordinator. Nothing outside this package imports a learner.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.core.eviction import PolicyFactory
from hybridkv.managers import spec_manager_map
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.policy.base import Admission, CachePolicy, ComputeStores, ReleaseRun, Shed
from hybridkv.policy.cost_aware import (
    CostAwareEvictionPolicy,
    class_shift,
    tier_value_class,
    unit_class,
    value_class,
)
from hybridkv.policy.hybrid import HybridPolicy
from hybridkv.policy.lru import LruPolicy
from hybridkv.policy.options import HybridOptions
from hybridkv.policy.reuse_horizon import ReuseHorizon
from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning
from hybridkv.specs import ChunkedLocalAttentionSpec, MambaSpec
from hybridkv.specs.base import KVCacheSpec

#: ``lru``: every computed block is cached and evicted least recently used first.
#: ``hybrid``: only what a later hit can use is kept (``hybridkv.policy.retention``).
CACHE_POLICIES = ("lru", "hybrid")


def check_cache_policy(value: object, field: str = "cache_policy") -> None:
    """One of ``CACHE_POLICIES``; ``ValueError`` naming ``field`` otherwise."""
    if value not in CACHE_POLICIES:
        raise ValueError(f"{field} must be one of {CACHE_POLICIES}, got {value!r}")


def auto_value_weight(specs: Sequence[KVCacheSpec], tuning: HybridTuning = DEFAULT_TUNING) -> float:
    """The default ``hybrid_value_weight`` of a layout, by its costliest
    non-full kind: attention chunks (a kept point holds up to a whole chunk),
    Mamba states, else sliding windows (``HybridTuning.value_weight``)."""
    kinds = set()
    if any(isinstance(s, ChunkedLocalAttentionSpec) for s in specs):
        kinds.add("chunked")
    if any(isinstance(s, MambaSpec) for s in specs):
        kinds.add("mamba")
    return tuning.value_weight(kinds)


def hybrid_in_force(cache_policy: str, enable_caching: bool, skips: Sequence[bool]) -> bool:
    """``hybrid`` decides only with prefix caching and a group that skips
    tokens (``skips``: per group); with full attention alone it must decide
    exactly as ``lru``."""
    return cache_policy == "hybrid" and enable_caching and any(skips)


def eviction_factory(
    cache_policy: str,
    options: HybridOptions,
    specs: Sequence[KVCacheSpec],
    enable_caching: bool,
) -> PolicyFactory | None:
    """The free set's ranking for the block pool: ``hybrid`` ranks by recency
    and value (``CostAwareEvictionPolicy``) with its value weight (None: the
    layout's, ``auto_value_weight``); None: the pool's default (LRU)."""
    skips = [(cls := spec_manager_map.get(type(s))) is None or cls.has_skips for s in specs]
    if not hybrid_in_force(cache_policy, enable_caching, skips):
        return None
    weight = options.value_weight
    if weight is None:
        weight = auto_value_weight(specs, options.tuning)
    tuning = options.tuning

    def build(blocks: list[KVCacheBlock]) -> CostAwareEvictionPolicy:
        reuse = (
            ReuseHorizon(tuning.reuse_window, tuning.learn_min_observed, tuning.reuse_margin)
            if tuning.learn_reuse_horizon
            else None
        )
        return CostAwareEvictionPolicy(blocks, float(weight), reuse)

    return build


def make_policy(
    cache_policy: str,
    options: HybridOptions | None,
    managers: Sequence[SingleTypeKVCacheManager],
    pool: BlockPool,
    hash_block_size: int,
    enable_caching: bool,
) -> CachePolicy:
    """The coordinator's policy over ``managers`` (their geometry) and ``pool``."""
    check_cache_policy(cache_policy)
    if not hybrid_in_force(cache_policy, enable_caching, [m.has_skips for m in managers]):
        return LruPolicy()
    ranking = pool.policy
    return HybridPolicy(
        managers,
        hash_block_size,
        pool.num_blocks,
        options if options is not None else HybridOptions(),
        getattr(ranking, "weight", 0.0),
        getattr(ranking, "ranks_by_value", False),
        ranking if isinstance(ranking, CostAwareEvictionPolicy) else None,
    )


__all__ = [
    "CACHE_POLICIES",
    "Admission",
    "CachePolicy",
    "ComputeStores",
    "CostAwareEvictionPolicy",
    "HybridOptions",
    "HybridPolicy",
    "HybridTuning",
    "LruPolicy",
    "ReleaseRun",
    "Shed",
    "auto_value_weight",
    "check_cache_policy",
    "class_shift",
    "eviction_factory",
    "make_policy",
    "tier_value_class",
    "unit_class",
    "value_class",
]
