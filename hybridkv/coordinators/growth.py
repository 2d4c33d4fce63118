"""``TableGrowth``: a step's new blocks and newly full blocks, in every group at once.

Both paths of ``KVCacheCoordinator`` end by growing each group's table to
cover the step's tokens (``allocate_new_blocks`` per group, in group order); a
live request's plain step (``KVCacheCoordinator.extend``: the decode steps that
cross a block boundary, fill a block or pass a window edge) also releases what
its query no longer reads and caches the blocks it filled. Doing that group by
group costs a few Python calls per group per step. Here it is done with fewer
calls and the same result, block for block:

- when every group grows plainly (``plain_allocation``) the pool pops all
  groups' blocks in one eviction pass (``BlockPool.get_new_blocks_each``: the
  same blocks, in the same order, as one take per group);
- when every group also has one block size (Gemma 3's sliding and full
  groups, most layouts), every table has the same length and the same count
  of cached entries (they are grown to the same ``ceil(tokens / block_size)``
  and cached to the same ``tokens // block_size``, and a hit gives every group
  ``hit // block_size`` entries), so a step that releases nothing is counted
  once::

      6 groups, block size 16, 48 computed, 49 need slots:
      tables  [a b c] [d e f] ... -> one take of 6 blocks, one appended to each
      horizon cover 64 (4 blocks), cache_at 64 (3 cached + 1)

- a step that releases is counted as ``allocate`` counts it (each group's
  ``get_num_blocks_to_allocate``), then released group by group in group order.

Nothing here decides: what does not fit is left to ``allocate``.
"""

from __future__ import annotations

from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.core.request import Request
from hybridkv.managers.base import NEVER, RequestBlockState, SingleTypeKVCacheManager


class TableGrowth:
    """Grows and caches the tables of ``managers`` (one request's states per call)."""

    def __init__(
        self, managers: list[SingleTypeKVCacheManager], pool: BlockPool, enable_caching: bool
    ) -> None:
        self.managers = managers
        self.pool = pool
        self.enable_caching = enable_caching
        #: Every group grows its tables plainly: one take for all groups.
        self.plain = all(m.plain_allocation for m in managers)
        sizes = {m.block_size for m in managers}
        strides = {m.hash_stride for m in managers}
        #: Plain, one block size, one hash view: the counts are the same in every group.
        self.uniform = self.plain and len(sizes) == 1 and len(strides) == 1
        self.block_size = min(sizes)
        self._group_ids = [m.group_id for m in managers]
        self._none: tuple[list[KVCacheBlock], ...] = tuple([] for _ in managers)

    def grow(
        self, states: list[RequestBlockState], num_tokens: int, grid: int
    ) -> tuple[list[KVCacheBlock], ...]:
        """Each group's ``allocate_new_blocks(st, num_tokens, grid)``, in group
        order; returns the new blocks per group."""
        managers = self.managers
        if not self.plain:
            pairs = zip(managers, states, strict=True)
            return tuple([m.allocate_new_blocks(st, num_tokens, grid) for m, st in pairs])
        counts = []
        for m, st in zip(managers, states, strict=True):
            missing = -(-num_tokens // m.block_size) - len(st.blocks)
            counts.append(missing if missing > 0 else 0)
        return self._append(states, counts)

    def _append(
        self, states: list[RequestBlockState], counts: list[int]
    ) -> tuple[list[KVCacheBlock], ...]:
        if len(counts) == 1:  # one group: the pool's plain call
            new = [self.pool.get_new_blocks(counts[0]) if counts[0] else []]
        else:
            new = self.pool.get_new_blocks_each(counts)
        for st, blocks in zip(states, new, strict=True):
            if blocks:
                st.blocks += blocks
        return tuple(new)

    def extend(
        self,
        states: list[RequestBlockState],
        request: Request,
        num_new_tokens: int,
        grid: int,
        releases: bool,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int | None, int] | None:
        """``KVCacheCoordinator.extend`` on the request's ``states`` (one per
        group): ``(new blocks per group, cover, release_at, cache_at)``, the
        latter three the request's new quiet horizon (``release_at`` None when
        not ``releases``: nothing was nulled, it stands), or ``None`` with
        nothing changed when the new blocks do not fit."""
        total_computed = request.num_computed_tokens
        num_tokens = total_computed + num_new_tokens
        cache_tokens = min(num_tokens, request.num_tokens)
        block_hashes, token_ids = request.live_block_hashes, request.live_token_ids
        lora_name = request.lora_name
        new = self._grown(states, num_tokens, total_computed, grid, releases)
        if new is None:
            return None
        managers = self.managers
        if self.uniform:
            first = states[0]
            bs = self.block_size
            if self.enable_caching and cache_tokens // bs > first.num_cached:
                self._cache_uniform(states, cache_tokens, block_hashes, token_ids, lora_name)
            cover, cache_at = len(first.blocks) * bs, (first.num_cached + 1) * bs
        else:
            cover = cache_at = NEVER
            for m, st in zip(managers, states, strict=True):
                bs = m.block_size
                if self.enable_caching and cache_tokens // bs > st.num_cached:
                    m.cache_blocks(st, block_hashes, token_ids, cache_tokens, lora_name)
                cover = min(cover, len(st.blocks) * bs)
                cache_at = min(cache_at, (st.num_cached + 1) * bs)
        if not releases:
            return new, cover, None, cache_at
        release_at = min([m.next_release_at(st) for m, st in zip(managers, states, strict=True)])
        return new, cover, release_at, cache_at

    def _grown(
        self,
        states: list[RequestBlockState],
        num_tokens: int,
        total_computed: int,
        grid: int,
        releases: bool,
    ) -> tuple[list[KVCacheBlock], ...] | None:
        """Count, then release and grow (``KVCacheCoordinator.allocate``'s order);
        None when the count does not fit."""
        managers = self.managers
        free = self.pool.num_free_blocks
        if releases:  # allocate's own count: new blocks less the blocks released
            need = 0
            for m, st in zip(managers, states, strict=True):
                need += m.get_num_blocks_to_allocate(st, num_tokens, [], total_computed, (), grid)
            if need > free:
                return None
            for m, st in zip(managers, states, strict=True):
                if m.has_skips:
                    m.remove_skipped_blocks(st, total_computed)
            return self.grow(states, num_tokens, grid)
        if self.uniform:  # nothing released: ``missing`` new blocks in every group
            missing = -(-num_tokens // self.block_size) - len(states[0].blocks)
            if missing <= 0:
                return self._none
            if missing * len(states) > free:
                return None
            return self._append(states, [missing] * len(states))
        need = 0
        grow = False
        for m, st in zip(managers, states, strict=True):
            missing = -(-num_tokens // m.block_size) - len(st.blocks)
            if missing > 0:
                grow = True
                need += (
                    missing
                    if m.plain_allocation
                    else m.get_num_blocks_to_allocate(st, num_tokens, [], 0, (), grid)
                )
        if need > free:
            return None
        return self.grow(states, num_tokens, grid) if grow else self._none

    def _cache_uniform(
        self,
        states: list[RequestBlockState],
        cache_tokens: int,
        block_hashes: list[bytes],
        token_ids: list[int],
        lora_name: str | None,
    ) -> None:
        """Every group's ``cache_blocks`` (uniform groups: one range for all)."""
        pool = self.pool
        if pool.enable_kv_cache_events:
            for m, st in zip(self.managers, states, strict=True):
                m.cache_blocks(st, block_hashes, token_ids, cache_tokens, lora_name)
            return
        # ``cache_blocks`` without events to emit, inline: one hash view, one range.
        bs = self.block_size
        num_full = cache_tokens // bs
        start = states[0].num_cached
        hashes = self.managers[0].group_hashes(block_hashes)
        run = pool.cache_run
        for gid, st in zip(self._group_ids, states, strict=True):
            run(st.blocks, hashes, gid, token_ids, bs, start, num_full)
            st.num_cached = num_full

    def check_integrity(self, states: list[RequestBlockState]) -> None:
        """One request's tables: with ``uniform`` groups, of one length and one
        count of cached entries (what ``extend`` counts once)."""
        if self.uniform:
            lengths = {(len(st.blocks), st.num_cached) for st in states}
            assert len(lengths) == 1, f"uniform groups' tables differ: {lengths}"
