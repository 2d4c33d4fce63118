"""KV cache specs (one per layer kind) and the config that groups layers."""

from hybridkv.specs.attention import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)
from hybridkv.specs.base import KVCacheSpec
from hybridkv.specs.config import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from hybridkv.specs.mamba import MambaSpec

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "KVCacheTensor",
    "MambaSpec",
    "SlidingWindowSpec",
]
