"""hybridkv: a hybrid-attention KV cache manager with automatic prefix caching.

Public names follow vLLM v1 (``KVCacheManager``, ``FullAttentionSpec``...).
"""

from hybridkv.cache_manager.kv_cache_blocks import KVCacheBlocks
from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from hybridkv.core.eviction import EvictionPolicy, LRUEvictionPolicy
from hybridkv.core.hashing import HASH_ALGOS, BlockHasher
from hybridkv.core.request import Request
from hybridkv.core.stats import PrefixCacheStats
from hybridkv.policy import CachePolicy, CostAwareEvictionPolicy, HybridOptions, HybridTuning
from hybridkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
)

__version__ = "0.1.0"

__all__ = [
    "HASH_ALGOS",
    "AllBlocksCleared",
    "AttentionSpec",
    "BlockHasher",
    "BlockRemoved",
    "BlockStored",
    "CachePolicy",
    "ChunkedLocalAttentionSpec",
    "CostAwareEvictionPolicy",
    "EvictionPolicy",
    "FullAttentionSpec",
    "HybridOptions",
    "HybridTuning",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheEvent",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "KVCacheTensor",
    "LRUEvictionPolicy",
    "MambaSpec",
    "PrefixCacheStats",
    "Request",
    "SlidingWindowSpec",
]
