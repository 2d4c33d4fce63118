"""The host-RAM, disk and shared-store tiers wired under an engine's device pool
(``docs/tiers.md``).

``TieredCache`` demotes what the pool reuses into the host tier (and what
the host evicts into the disk tier) and restores a waiting request's tier
hit onto the device before its prefix lookup; ``build_tiered_cache`` makes
one from ``CacheConfig``'s tier fields. These names import torch (the engine
extra) when first used: the package itself does not, so the simulator (core
install) can use its torch-free modules, ``load_cost`` and ``swap_decision``
(``hybridkv.tiers`` below does not import torch either).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Each public name and the module it is imported from on first use.
_FROM = {
    "BlockBytes": "block_bytes",
    "OffloadStats": "stats",
    "TieredCache": "tiered_cache",
    "build_tiered_cache": "setup",
    "check_disk_cache_dir": "setup",
    "check_kv_store": "setup",
    "check_tier_settings": "setup",
    "hybrid_with_tiers": "setup",
    "weights_identity": "setup",
}

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


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module 'hybridkv.offload' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hybridkv.offload.{module}"), name)
    globals()[name] = value
    return value
