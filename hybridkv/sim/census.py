"""Counting a manager's blocks by layer kind (full, sliding_window, chunked_local, mamba).

A block id is one page across the shared buffers; its kind is the kind of the
group that holds it. Cached blocks (in the prefix index, in use or free) know
their group; blocks in use are found through the requests' block tables.
These walks read the pool or the tables and change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.specs import KVCacheConfig

#: Display and JSON order of the kinds.
KIND_ORDER = ("full", "sliding_window", "chunked_local", "mamba")


def group_kinds(config: KVCacheConfig) -> list[str]:
    """The layer kind of each group, by group id."""
    return [g.kv_cache_spec.kind for g in config.kv_cache_groups]


def empty_by_kind(config: KVCacheConfig) -> dict[str, int]:
    """A zero count for every kind the config has, in ``KIND_ORDER``."""
    present = set(group_kinds(config))
    return {k: 0 for k in KIND_ORDER if k in present}


def cached_blocks_by_kind(manager: KVCacheManager) -> dict[str, int]:
    """Blocks in the prefix cache (a hash set), per kind."""
    config = manager.kv_cache_config
    kinds = group_kinds(config)
    counts = empty_by_kind(config)
    for b in manager.block_pool.blocks:
        if b.block_hash is not None and b.group_id is not None:
            counts[kinds[b.group_id]] += 1
    return counts


def blocks_in_use_by_kind(manager: KVCacheManager, request_ids: Iterable[str]) -> dict[str, int]:
    """Distinct non-null blocks in the tables of ``request_ids``, per kind."""
    config = manager.kv_cache_config
    kinds = group_kinds(config)
    per_group: list[set[int]] = [set() for _ in kinds]
    for rid in request_ids:
        for g, ids in enumerate(manager.get_block_ids(rid)):
            per_group[g].update(ids)
    counts = empty_by_kind(config)
    for g, used in enumerate(per_group):
        used.discard(0)
        counts[kinds[g]] += len(used)
    return counts


def retained_blocks(manager: KVCacheManager) -> int:
    """Blocks live requests retain for their kept points behind their windows
    (``hybrid``: ``RequestBlockState.retained``; 0 under ``lru``), every group."""
    return sum(len(st.retained) for m in manager.coordinator.managers for st in m.states.values())
