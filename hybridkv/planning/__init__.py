"""Memory planning: page-size unification, grouping, KVCacheConfig, buffers."""

from hybridkv.planning.capacity import Capacity
from hybridkv.planning.grouping import GROUPINGS, Grouping, PlannedGroup
from hybridkv.planning.memory import (
    AttentionCache,
    KVCacheBuffers,
    MambaCache,
    allocate_kv_cache,
    layer_byte_range,
)
from hybridkv.planning.planner import KVCachePlan, get_kv_cache_config, plan_kv_cache
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
    "PlannedGroup",
    "UnifiedSpecs",
    "allocate_kv_cache",
    "get_kv_cache_config",
    "layer_byte_range",
    "plan_kv_cache",
    "unify_packed",
    "unify_vllm",
]
