"""``KVCacheBlocks``: the blocks the manager hands back, one sequence per group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hybridkv.core.block import KVCacheBlock


@dataclass(slots=True)
class KVCacheBlocks:
    """``blocks[g]`` is group ``g``'s list (hit blocks, or newly allocated); a
    step that allocates nothing returns one shared instance whose groups are
    empty tuples (as vLLM's ``empty_kv_cache_blocks``): read it, never change it.

    ``full_hit_tokens``: for a prefix hit, how far the full-attention groups
    alone matched (>= the hit; the ``hybrid`` policy's branch point).
    ``pool``: the block pool a prefix hit came from (set by
    ``get_computed_blocks``), so that adopting it checks ownership in O(1);
    blocks from anywhere else are checked one by one. ``generation`` and
    ``hashes``: the pool's ``generation`` when the hit was found, and the block
    hashes (the request's own list) it was found for: adopting it for the same
    request at the same generation skips the per-block staleness check (no
    cached block has left the index since). Pass a hit to ``allocate_slots``
    as it was returned.
    """

    blocks: tuple[Sequence[KVCacheBlock], ...]
    full_hit_tokens: int = 0
    pool: object | None = field(default=None, repr=False, compare=False)
    generation: int = field(default=-1, repr=False, compare=False)
    hashes: object | None = field(default=None, repr=False, compare=False)

    def get_block_ids(self) -> tuple[list[int], ...]:
        """Block ids per group (0 marks the null block)."""
        return tuple([b.block_id for b in group] for group in self.blocks)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        if len(self.blocks) != len(other.blocks):
            raise ValueError("cannot add KVCacheBlocks with different group counts")
        pairs = zip(self.blocks, other.blocks, strict=True)
        return KVCacheBlocks(tuple([*a, *b] for a, b in pairs))

    @classmethod
    def empty(cls, num_groups: int) -> KVCacheBlocks:
        """No blocks in any group (immutable: one empty tuple per group)."""
        return cls(((),) * num_groups)

    def __len__(self) -> int:
        return len(self.blocks)
