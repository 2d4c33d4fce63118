"""KV cache events, so an external router can mirror the cache's contents.

Events are collected only with ``enable_kv_cache_events=True`` and drained by
``KVCacheManager.take_events()``. Hashes are the raw block hashes; the cache
key is ``(block_hash, group_id)``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks entered the prefix cache (a chain, in order)."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None
    group_id: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted)."""

    block_hashes: list[bytes]
    group_id: int


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
