"""KV cache events, so an external router can mirror the cache's contents.

Events are collected only with ``enable_kv_cache_events=True`` and drained by
``KVCacheManager.take_events()``. Hashes are the raw block hashes; the cache
key is ``(block_hash, group_id)``. Events track keys, not blocks (a key's
duplicate blocks are silent; ``BlockPool``'s docstring), so mirroring them in a
set reproduces the index's keys. ``hybridkv.events`` publishes them in vLLM's
wire format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Keys entered the prefix cache: consecutive blocks of one chain, in order.

    ``parent_block_hash`` is the hash of the block before the first (None for
    a request's block 0); ``token_ids`` are exactly these blocks' tokens.
    ``medium``: where the keys now live; None is the device pool (the
    publisher's medium), else a lower tier's (``hybridkv.offload``: "CPU" for
    the host tier, "STORAGE" for the disk tier, vLLM's names).
    """

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None
    group_id: int
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Keys left the prefix cache (their last block was evicted); ``medium`` as
    ``BlockStored``'s (None: the device pool)."""

    block_hashes: list[bytes]
    group_id: int
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


def consecutive_runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ascending ints, as half-open ``(start, stop)``.

    ``[0, 1, 2, 5, 6, 9]`` -> ``[(0, 3), (5, 7), (9, 10)]``.
    """
    runs: list[tuple[int, int]] = []
    if not indices:
        return runs
    start = prev = indices[0]
    for i in indices[1:]:
        if i != prev + 1:
            runs.append((start, prev + 1))
            start = i
        prev = i
    runs.append((start, prev + 1))
    return runs
