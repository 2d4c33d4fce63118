"""Per-kind block-table managers and the spec -> manager map."""

from __future__ import annotations

from hybridkv.core.block_pool import BlockPool
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.managers.chunked_local import ChunkedLocalAttentionManager
from hybridkv.managers.full_attention import FullAttentionManager
from hybridkv.managers.mamba import MambaManager
from hybridkv.managers.points import Hold
from hybridkv.managers.sliding_window import SlidingWindowManager
from hybridkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

spec_manager_map: dict[type[KVCacheSpec], type[SingleTypeKVCacheManager]] = {
    FullAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
}


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec,
    block_pool: BlockPool,
    group_id: int,
    hash_block_size: int,
    enable_caching: bool,
    hold: Hold | None = None,
) -> SingleTypeKVCacheManager:
    """Build the manager for a spec (``hold``: a cache policy's, ``Hold``); an
    unknown spec type is a ``ValueError``."""
    cls = spec_manager_map.get(type(kv_cache_spec))
    if cls is None:
        raise ValueError(
            f"no manager for {type(kv_cache_spec).__name__}; supported: "
            f"{sorted(c.__name__ for c in spec_manager_map)}"
        )
    return cls(kv_cache_spec, block_pool, group_id, hash_block_size, enable_caching, hold)


__all__ = [
    "ChunkedLocalAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "get_manager_for_kv_cache_spec",
    "spec_manager_map",
]
