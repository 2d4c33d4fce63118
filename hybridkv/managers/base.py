"""``SingleTypeKVCacheManager``: the block tables of one KV cache group.

The base class does all bookkeeping once; a layer kind only says which tokens
a query no longer needs (``get_num_skipped_tokens``; ``skip_rule.SkipRule``,
which every manager is, derives what a running request holds). Everything
follows:

- skipped blocks (wholly before the first needed token) are replaced by the
  null block in the table and released, so a running request holds only what
  its next query can read;
- a prefix hit of ``L`` tokens is valid iff every block from the first token
  needed at position ``L`` up to ``L`` is cached (``find_longest_cache_hit``
  returns the longest valid hit, null blocks before the needed range).

Table entries are never removed while the request lives (block tables are
append-only); ``pop_request`` hands the whole table back to the coordinator,
which decides the release order. Methods take the request's
``RequestBlockState`` (looked up once per call by the coordinator); nothing
here checks free space: the coordinator counts first, then acts.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import filterfalse
from operator import attrgetter
from typing import ClassVar

from hybridkv.core.block import KVCacheBlock, num_leading_nulls
from hybridkv.core.block_pool import BlockPool
from hybridkv.core.events import consecutive_runs
from hybridkv.managers.points import Hold, segments
from hybridkv.managers.skip_rule import SkipRule
from hybridkv.managers.state import NEVER, RequestBlockState
from hybridkv.specs.base import KVCacheSpec

_ref_cnt = attrgetter("ref_cnt")
_is_null = attrgetter("is_null")


def _is_real(block: KVCacheBlock) -> bool:
    return not block.is_null


__all__ = ["NEVER", "RequestBlockState", "SingleTypeKVCacheManager"]


class SingleTypeKVCacheManager(SkipRule):
    """Block tables and prefix-hit rule for one group of one layer kind."""

    #: True when a valid hit of L tokens implies every shorter aligned hit is
    #: valid (full attention), so a hit can simply be truncated.
    prefix_closed: ClassVar[bool] = False
    #: True when growing a table appends ``required - have`` new blocks (this
    #: class's ``allocate_new_blocks``; a kind that overrides it says False): the
    #: coordinator then pops several groups' blocks at once (``TableGrowth``).
    plain_allocation: ClassVar[bool] = True

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        group_id: int,
        hash_block_size: int,
        enable_caching: bool,
        hold: Hold | None = None,
    ) -> None:
        super().__init__(kv_cache_spec.block_size, hold)
        self.spec = kv_cache_spec
        if self.block_size % hash_block_size:
            raise ValueError(
                f"group {group_id}: block_size {self.block_size} is not a multiple of "
                f"the hash block size {hash_block_size}"
            )
        self.hash_stride = self.block_size // hash_block_size
        self.pool = block_pool
        self.group_id = group_id
        self.enable_caching = enable_caching
        self.null_block = block_pool.null_block
        self.states: dict[str, RequestBlockState] = {}

    @property
    def req_to_blocks(self) -> dict[str, list[KVCacheBlock]]:
        """Each live request's block table (a snapshot dict, for inspection)."""
        return {rid: st.blocks for rid, st in self.states.items()}

    # -- allocation ----------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        st: RequestBlockState | None,
        num_tokens: int,
        new_computed_blocks: list[KVCacheBlock],
        total_computed_tokens: int,
        kept: tuple[int, ...] = (),
        grid: int = 0,
        lean: bool = False,
    ) -> int:
        """Net free blocks this step consumes: new blocks, plus hit blocks that
        leave the free set, minus skipped blocks that return to it (retained
        blocks of kept points do not return). ``kept``: a new request's kept
        points (an existing request's are on ``st``); ``grid``: the policy's
        branch grid (``CachePolicy.grid``). ``lean`` (a live request): counted
        as if it had first given up every kept point and its tail
        (``shed(st, (), holds_tail=False)``), so that it holds what ``lru`` would."""
        have = len(new_computed_blocks)
        if st is not None:
            have += len(st.blocks)
            kept = () if lean else st.kept
        required = -(-num_tokens // self.block_size)
        n = (
            self._num_new_real_blocks(have, required, num_tokens, kept, grid)
            if required > have
            else 0
        )
        if new_computed_blocks:  # free hit blocks leave the free set
            n += self._num_free_hit_blocks(new_computed_blocks)
        if st is not None and self.has_skips:
            stop = self.release_stop(st, total_computed_tokens, lean)
            if stop > st.num_skipped:
                blocks = st.blocks
                for lo, hi, is_kept in segments(self.kept_spans(kept), st.num_skipped, stop):
                    if not is_kept:  # blocks only this request holds (null: ref count 0)
                        n -= list(map(_ref_cnt, blocks[lo:hi])).count(1)
            if lean:  # its retained blocks return too
                n -= [b.ref_cnt for _, b in st.retained].count(1)
        return n

    def _num_free_hit_blocks(self, blocks: list[KVCacheBlock]) -> int:
        """Hit blocks that are free (ref count 0; the null block, also 0, is
        not). A window's hit is mostly leading null blocks: those are found
        by bisection, checked in one identity pass, and skipped."""
        null = self.null_block
        k = bisect_left(blocks, True, key=_is_real) if self.has_skips else 0
        if k and blocks[:k].count(null) != k:
            k = 0  # not all leading: count everything
        tail = blocks[k:] if k else blocks
        return list(map(_ref_cnt, tail)).count(0) - tail.count(null)

    def _num_new_real_blocks(
        self, have: int, required: int, num_tokens: int, kept: tuple[int, ...], grid: int = 0
    ) -> int:
        """Blocks to pop for table positions ``have .. required-1`` (> have)."""
        return required - have

    def add_request(
        self,
        request_id: str,
        new_computed_blocks: list[KVCacheBlock],
        kept: tuple[int, ...] = (),
    ) -> RequestBlockState:
        """Start a table from prefix-hit blocks (already touched), or empty."""
        null = self.null_block
        skipped = (
            num_leading_nulls(new_computed_blocks, null)
            if new_computed_blocks and new_computed_blocks[0] is null
            else 0
        )
        st = RequestBlockState(list(new_computed_blocks), len(new_computed_blocks), skipped, kept)
        self.states[request_id] = st
        return st

    def remove_skipped_blocks(self, st: RequestBlockState, total_computed_tokens: int) -> None:
        """Null out and release blocks no query of this request reads again.

        ``hybrid``: blocks a kept point needs are retained (held until the
        request is freed); the others are released evict-first.
        """
        blocks = st.blocks
        start = st.num_skipped
        stop = self.release_stop(st, total_computed_tokens)
        if stop <= start:
            return
        null = self.null_block
        removed: list[KVCacheBlock] = []
        hybrid = self.hybrid
        retained = st.retained
        for lo, hi, is_kept in reversed(segments(self.kept_spans(st.kept), start, stop)):
            if is_kept:
                for i in range(hi - 1, lo - 1, -1):  # tail first
                    b = blocks[i]
                    if not b.is_null:
                        retained.append((i, b))
            else:  # tail first, in C
                removed += filterfalse(_is_null, reversed(blocks[lo:hi]))
            blocks[lo:hi] = [null] * (hi - lo)
        st.num_skipped = stop
        self.pool.free_blocks(removed, evict_first=hybrid)

    def allocate_new_blocks(
        self, st: RequestBlockState, num_tokens: int, grid: int = 0
    ) -> list[KVCacheBlock]:
        """Extend the table to cover ``num_tokens``; returns the new entries
        (``grid``: as for ``get_num_blocks_to_allocate``)."""
        blocks = st.blocks
        required = -(-num_tokens // self.block_size)
        if required <= len(blocks):
            return []
        new = self.pool.get_new_blocks(required - len(blocks))
        blocks.extend(new)
        return new

    # -- prefix caching ------------------------------------------------------
    def cache_blocks(
        self,
        st: RequestBlockState,
        block_hashes: list[bytes],
        token_ids: list[int],
        num_tokens: int,
        lora_name: str | None = None,
    ) -> None:
        """Enter the full blocks covering ``num_tokens`` into the cache.

        ``block_hashes`` are the request's hashes at the hash block size.
        With events on, each run of consecutive blocks whose keys are new to
        the index becomes one ``BlockStored`` (chained to the block before it);
        null blocks and duplicates of cached keys split runs and emit nothing.
        """
        bs = self.block_size
        num_full = num_tokens // bs
        start = st.num_cached
        if num_full <= start:
            return
        hashes = self.group_hashes(block_hashes)
        pool = self.pool
        gid = self.group_id
        stored = pool.cache_run(st.blocks, hashes, gid, token_ids, bs, start, num_full)
        st.num_cached = num_full
        if stored and pool.enable_kv_cache_events:
            for first, stop in consecutive_runs(stored):
                pool.record_stored(
                    hashes[first:stop],
                    hashes[first - 1] if first > 0 else None,
                    token_ids[first * bs : stop * bs],
                    bs,
                    lora_name,
                    gid,
                )

    def group_hashes(self, block_hashes: list[bytes]) -> list[bytes]:
        """This group's block hashes from the request's hash-block-size hashes.

        Hashes are chained, so the hash of the last small block inside a big
        block commits to every token up to the big block's end.
        """
        k = self.hash_stride
        return block_hashes if k == 1 else block_hashes[k - 1 :: k]

    def _lookup(self, hashes: list[bytes], i: int, token_ids: list[int]) -> KVCacheBlock | None:
        """Block ``i``'s cached block if it also holds those tokens (the check a
        non-cryptographic hash needs; without it, scans read the index directly)."""
        bs = self.block_size
        return self.pool.get_cached_block(
            hashes[i], self.group_id, token_ids[i * bs : (i + 1) * bs]
        )

    def find_longest_cache_hit(
        self, hashes: list[bytes], max_length: int, token_ids: list[int] | None = None
    ) -> list[KVCacheBlock]:
        """Longest valid hit of at most ``max_length`` tokens. Read-only.

        For a candidate end, the blocks from the first needed one up to the
        end must all be cached; a miss at block ``i`` rules out every end above
        ``i`` (a longer hit needs a range that still holds ``i``), so the next
        candidate end is the first miss. Returns ``hit_length // block_size``
        entries, null before the needed range. ``token_ids`` turns on the
        stored-token check.
        """
        if token_ids is None:  # looked up in C
            get = self.pool.cached[self.group_id].get

            def look(first: int, end: int) -> list[KVCacheBlock | None]:
                return list(map(get, hashes[first:end]))
        else:

            def look(first: int, end: int) -> list[KVCacheBlock | None]:
                return [self._lookup(hashes, i, token_ids) for i in range(first, end)]

        end = min(max_length // self.block_size, len(hashes))
        while end > 0:
            first = self.first_needed_block(end * self.block_size)
            part = look(first, end)
            if None not in part:
                return [self.null_block] * first + part  # type: ignore[operator]
            end = first + part.index(None)
        return []

    # -- release -------------------------------------------------------------
    def shed(
        self, st: RequestBlockState, kept: tuple[int, ...], holds_tail: bool = True
    ) -> list[KVCacheBlock]:
        """The request keeps only ``kept`` (a subset of its kept points, as its
        cache policy decided), and its tail only while ``holds_tail`` (once
        given up, for good): returns the retained blocks it lets go, to be
        released evict-first. The tail's blocks are released by the request's
        next ``remove_skipped_blocks``."""
        released = [b for _, b in st.retained]
        st.retained = []
        st.kept = kept
        st.holds_tail = st.holds_tail and holds_tail
        return released

    def pop_request(self, request_id: str) -> RequestBlockState | None:
        """Forget the request; return its state for the coordinator to free."""
        return self.states.pop(request_id, None)

    # -- integrity -----------------------------------------------------------
    def check_integrity(self) -> None:
        """Per-request tables are consistent with the counters and the pool."""
        for rid, st in self.states.items():
            blocks = st.blocks
            assert 0 <= st.num_skipped <= len(blocks), f"{rid}: bad num_skipped"
            assert 0 <= st.num_cached <= len(blocks), f"{rid}: bad num_cached"
            for i, b in enumerate(blocks):
                if i < st.num_skipped:
                    assert b.is_null, f"{rid}: block {i} should be null (skipped)"
                if b.is_null:
                    continue
                assert b.ref_cnt >= 1, f"{rid}: held block {b} has ref count 0"
            for i, b in st.retained:
                assert i < st.num_skipped and not b.is_null and b.ref_cnt >= 1, (
                    f"{rid}: bad retained block {i}: {b}"
                )
                assert self.is_kept(st.kept, i), f"{rid}: retained block {i} is not kept"
                if i < st.num_cached and self.enable_caching:
                    assert b.block_hash is not None and b.group_id == self.group_id, (
                        f"{rid}: full block {i} ({b}) is not cached in group {self.group_id}"
                    )
