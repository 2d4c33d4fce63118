"""Mamba layers: one recurrent state per block instead of per-token KV.

Table entry ``i`` holds the state after the tokens up to the end of block
``i`` (for the last, partial block: after the computed tokens). A step that
computes tokens ``[n, m)`` reads the state in entry ``(n - 1) // bs`` (none for
``n == 0``), writes the final state in entry ``(m - 1) // bs`` and, with
prefix caching, a checkpoint in the entry of every block boundary it crosses;
those full entries are cached like attention blocks. Entry ``(n - 1) // bs``
may be a cached checkpoint shared with other requests: it is only read, as
new states always go to later entries once a block is full.

- Running state: everything before entry ``(n - 1) // bs`` is skipped, so a
  request holds one block (two while crossing a block boundary).
- Hits: a hit of ``L`` tokens needs exactly the checkpoint at ``L``.
- Without prefix caching nobody reads checkpoints, so the entries a step
  crosses stay null and only the last one gets a block.
"""

from __future__ import annotations

from hybridkv.core.block import KVCacheBlock
from hybridkv.managers.base import RequestBlockState, SingleTypeKVCacheManager
from hybridkv.managers.retention import mamba_real_entries
from hybridkv.specs.base import cdiv


class MambaManager(SingleTypeKVCacheManager):
    """State blocks of a Mamba group (block-aligned checkpoints)."""

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)

    def _num_new_real_blocks(
        self, have: int, required: int, num_tokens: int, kept: tuple[int, ...]
    ) -> int:
        if not self.enable_caching:
            return 1
        if self.hybrid:
            return len(
                mamba_real_entries(
                    have, required, num_tokens, kept, self.block_size, self.tail, self.hit_step
                )
            )
        return required - have

    def allocate_new_blocks(self, st: RequestBlockState, num_tokens: int) -> list[KVCacheBlock]:
        if self.hybrid:
            blocks = st.blocks
            have, required = len(blocks), cdiv(num_tokens, self.block_size)
            if required <= have:
                return []
            real = mamba_real_entries(
                have, required, num_tokens, st.kept, self.block_size, self.tail, self.hit_step
            )
            new = self.pool.get_new_blocks(len(real))
            blocks.extend([self.null_block] * (required - have))
            for j, b in zip(real, new, strict=True):
                blocks[j] = b
            return new
        if self.enable_caching:
            return super().allocate_new_blocks(st, num_tokens)
        blocks = st.blocks
        required = cdiv(num_tokens, self.block_size)
        if required <= len(blocks):
            return []
        new = self.pool.get_new_blocks(1)
        blocks.extend([self.null_block] * (required - len(blocks) - 1))
        blocks.extend(new)
        return new
