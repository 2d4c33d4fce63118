"""Mamba layers: one recurrent state per block instead of per-token KV.

Table entry ``i`` holds the state after the tokens up to the end of block
``i`` (for the last, partial block: after the computed tokens). A step that
computes tokens ``[n, m)`` reads the state in entry ``(n - 1) // bs`` (none for
``n == 0``), writes the final state in entry ``(m - 1) // bs`` and, with
prefix caching, a snapshot in the entry of every block boundary it crosses;
those full entries are cached like attention blocks. Entry ``(n - 1) // bs``
may be a cached snapshot shared with other requests: it is only read, as
new states always go to later entries once a block is full.

- Running state: everything before entry ``(n - 1) // bs`` is skipped, so a
  request holds one block (two while crossing a block boundary).
- Hits: a hit of ``L`` tokens needs exactly the snapshot at ``L``.
- Without prefix caching nobody reads snapshots, so the entries a step
  crosses stay null and only the last one gets a block.
"""

from __future__ import annotations

from typing import ClassVar

from hybridkv.core.block import KVCacheBlock
from hybridkv.managers.base import RequestBlockState, SingleTypeKVCacheManager
from hybridkv.managers.snapshots import snapshot_entries
from hybridkv.specs.base import cdiv


class MambaManager(SingleTypeKVCacheManager):
    """State blocks of a Mamba group (block-aligned snapshots, ``hybridkv.managers.snapshots``)."""

    plain_allocation: ClassVar[bool] = False  # null entries between snapshots

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)

    def min_tokens_skipping(self, num_skipped: int) -> int:
        return num_skipped + 1

    def _real(
        self, have: int, required: int, num_tokens: int, kept: tuple[int, ...], grid: int
    ) -> list[int]:
        return snapshot_entries(
            have,
            required,
            num_tokens,
            block_size=self.block_size,
            caching=self.enable_caching,
            hybrid=self.hybrid,
            kept=kept,
            tail=self.tail,
            step=self.hit_step,
            align=grid,
        )

    def _num_new_real_blocks(
        self, have: int, required: int, num_tokens: int, kept: tuple[int, ...], grid: int = 0
    ) -> int:
        return len(self._real(have, required, num_tokens, kept, grid))

    def allocate_new_blocks(
        self, st: RequestBlockState, num_tokens: int, grid: int = 0
    ) -> list[KVCacheBlock]:
        blocks = st.blocks
        have, required = len(blocks), cdiv(num_tokens, self.block_size)
        if required <= have:
            return []
        real = self._real(have, required, num_tokens, st.kept, grid)
        new = self.pool.get_new_blocks(len(real))
        blocks.extend([self.null_block] * (required - have))
        for j, b in zip(real, new, strict=True):
            blocks[j] = b
        return new
