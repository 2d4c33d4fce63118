"""The host-RAM, disk and shared-store tiers wired under an engine's device pool
(``docs/tiers.md``).

``TieredCache`` demotes what the pool reuses into the host tier (and what
the host evicts into the disk tier) and restores a waiting request's tier
hit onto the device before its prefix lookup; ``build_tiered_cache`` makes
one from ``CacheConfig``'s tier fields. Imports torch (the engine extra):
``hybridkv.tiers`` below it does not.
"""

from hybridkv.offload.block_bytes import BlockBytes
from hybridkv.offload.setup import (
    build_tiered_cache,
    check_disk_cache_dir,
    check_kv_store,
    check_tier_settings,
    hybrid_with_tiers,
    weights_identity,
)
from hybridkv.offload.stats import OffloadStats
from hybridkv.offload.tiered_cache import TieredCache

__all__ = [
    "BlockBytes",
    "OffloadStats",
    "TieredCache",
    "build_tiered_cache",
    "check_disk_cache_dir",
    "check_kv_store",
    "check_tier_settings",
    "hybrid_with_tiers",
    "weights_identity",
]
