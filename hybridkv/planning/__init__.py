"""Memory planning: page-size unification, grouping, KVCacheConfig, buffers.

Importing it needs only the core install: torch is imported by
``allocate_kv_cache`` alone, the one function that makes tensors.
"""

from hybridkv.planning.capacity import Capacity
from hybridkv.planning.grouping import GROUPINGS, Grouping, PlannedGroup
from hybridkv.planning.memory import (
    AttentionCache,
    KVCacheBuffers,
    MambaCache,
    allocate_kv_cache,
    layer_byte_range,
)
from hybridkv.planning.planner import (
    KVCachePlan,
    PagePlan,
    fit_memory,
    get_kv_cache_config,
    plan_capacity,
    plan_kv_cache,
    plan_pages,
)
from hybridkv.planning.unify import STRATEGIES, UnifiedSpecs, unify_packed, unify_vllm

__all__ = [
    "GROUPINGS",
    "STRATEGIES",
    "AttentionCache",
    "Capacity",
    "Grouping",
    "KVCacheBuffers",
    "KVCachePlan",
    "MambaCache",
    "PagePlan",
    "PlannedGroup",
    "UnifiedSpecs",
    "allocate_kv_cache",
    "fit_memory",
    "get_kv_cache_config",
    "layer_byte_range",
    "plan_capacity",
    "plan_kv_cache",
    "plan_pages",
    "unify_packed",
    "unify_vllm",
]
