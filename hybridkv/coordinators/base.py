"""``KVCacheCoordinator``: drives every group's manager as one.

The coordinator makes multi-group operations atomic (count first, then act).
Subclasses differ only in how a prefix hit is found across groups. What to
keep and in which order to release it is the cache policy's
(``hybridkv.policy.CachePolicy``): the coordinator asks it through a few
hooks of plain data and applies the answers.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from hybridkv.coordinators.growth import TableGrowth
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.core.request import Request
from hybridkv.managers import SingleTypeKVCacheManager, get_manager_for_kv_cache_spec
from hybridkv.managers.base import NEVER, RequestBlockState
from hybridkv.policy import CachePolicy, HybridOptions, make_policy
from hybridkv.specs import KVCacheConfig


class KVCacheCoordinator(ABC):
    """All groups' managers over one block pool, steered by one cache policy.

    ``cache_policy``: ``"lru"`` or ``"hybrid"``; ``hybrid``: the latter's
    settings (``HybridOptions``). ``hybrid`` changes nothing without prefix
    caching or without a group that skips tokens (then ``lru`` decides).
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        block_pool: BlockPool,
        hash_block_size: int,
        enable_caching: bool,
        cache_policy: str = "lru",
        hybrid: HybridOptions | None = None,
    ) -> None:
        self.pool = block_pool
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        groups = kv_cache_config.kv_cache_groups

        def build(policy: CachePolicy | None) -> list[SingleTypeKVCacheManager]:
            return [
                get_manager_for_kv_cache_spec(
                    g.kv_cache_spec,
                    block_pool,
                    gid,
                    hash_block_size,
                    enable_caching,
                    None if policy is None else policy.hold(gid),
                )
                for gid, g in enumerate(groups)
            ]

        # The policy reads the groups' geometry, then each manager is built
        # with what the policy has its running requests hold.
        managers = build(None)
        #: The cache policy (``hybridkv.policy``).
        self.policy: CachePolicy = make_policy(
            cache_policy, hybrid, managers, block_pool, hash_block_size, enable_caching
        )
        self.managers = managers if not self.policy.keeps_points else build(self.policy)
        sizes = {m.block_size for m in self.managers}
        self.block_size_lcm = math.lcm(*sizes)
        #: Requests keep points (``hybrid`` in force).
        self.hybrid = self.policy.keeps_points
        #: Tokens the full-attention groups alone matched in the last
        #: ``find_longest_cache_hit`` (the branch point; without such groups, the hit).
        self.last_full_hit_tokens = 0
        self._no_hit: tuple[list[KVCacheBlock], ...] = tuple([] for _ in self.managers)
        #: Grows (and, for ``extend``, caches) every group's tables in few calls.
        self.growth = TableGrowth(self.managers, block_pool, enable_caching)
        #: Holders of pool blocks outside the tables (a tier's loads in flight):
        #: each gives the blocks it holds once per reference, for ``check_integrity``.
        self.other_holders: list[Callable[[], Iterable[KVCacheBlock]]] = []

    # -- allocation (atomic across groups) -----------------------------------
    def allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[list[KVCacheBlock], ...] | None,
        total_computed_tokens: int,
        kept: tuple[int, ...] = (),
    ) -> tuple[list[KVCacheBlock], ...] | None:
        """Give every group's table room for ``num_tokens``, or change nothing.

        Counts the net free blocks all groups need (new blocks, plus hit blocks
        leaving the free set, minus skipped blocks returning to it) and returns
        ``None`` if they do not fit, unless (a running request's step) the
        policy has a live request shed kept points to make them fit
        (``CachePolicy.make_room``). Otherwise releases skipped blocks, adopts
        the hit blocks, extends the tables, and returns each group's new blocks.
        ``kept``: a new request's kept points (``hybrid`` policy).
        """
        managers = self.managers
        grid = self.policy.grid
        states = [m.states.get(request_id) for m in managers]
        if new_computed_blocks is None and self._nothing_to_do(
            states, num_tokens, total_computed_tokens
        ):
            return tuple([] for _ in managers)
        hit = new_computed_blocks or self._no_hit
        need = 0
        free = self.pool.num_free_blocks
        for m, st, h in zip(managers, states, hit, strict=True):
            need += m.get_num_blocks_to_allocate(
                st, num_tokens, h, total_computed_tokens, kept, grid
            )
            if st is None and need > free:
                return None  # a new table's count is never negative: the rest only adds
        if need > free:
            # Only a running request's step gets here (a new table returned
            # above), and only it may take kept points instead (``make_room``).
            if not self._make_room(request_id, need - free, num_tokens, hit, total_computed_tokens):
                return None
            need = sum(
                m.get_num_blocks_to_allocate(st, num_tokens, h, total_computed_tokens, kept, grid)
                for m, st, h in zip(managers, states, hit, strict=True)
            )
            assert need <= self.pool.num_free_blocks, "shedding returned too few blocks"
        # Release every group's skipped blocks before any group pops new ones:
        # the count above relies on them being back in the free set.
        for m, st in zip(managers, states, strict=True):
            if st is not None and m.has_skips:
                m.remove_skipped_blocks(st, total_computed_tokens)
        if new_computed_blocks is not None:
            for blocks in new_computed_blocks:
                self.pool.touch(blocks)
        tables = [
            st if st is not None else m.add_request(request_id, h, kept)
            for m, st, h in zip(managers, states, hit, strict=True)
        ]
        return self.growth.grow(tables, num_tokens, grid)

    def extend(
        self, request: Request, num_new_tokens: int, releases: bool
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int | None, int] | None:
        """A live request's plain step of ``num_new_tokens`` (no hit adopted, no
        lookahead, within ``max_model_len``): ``allocate`` for its computed
        tokens plus those, then ``cache_blocks`` up to ``min(that, num_tokens)``:
        the same blocks in the same order, in fewer calls (``TableGrowth``).
        ``releases``: some group may pass its release point (the computed tokens
        reached the quiet horizon's ``release_at``); else none does, and nothing
        is counted for it. Returns the new blocks per group and the request's new
        ``(cover, release_at, cache_at)`` (``release_at`` None: unchanged), or
        ``None`` with nothing changed when the blocks do not fit (``allocate``
        then decides whether a request sheds kept points to make room)."""
        states = [m.states[request.request_id] for m in self.managers]
        return self.growth.extend(states, request, num_new_tokens, self.policy.grid, releases)

    def _make_room(
        self,
        request_id: str,
        short: int,
        num_tokens: int,
        hit: tuple[list[KVCacheBlock], ...],
        total_computed_tokens: int,
    ) -> bool:
        """Apply the policy's ``make_room`` for the step of ``request_id``
        (``short`` blocks missing): the request it names keeps only the kept
        points it says and releases what it retained (evict-first). A ``Shed``
        that gives up the stepping request's tail is applied only if the step
        then fits (counted first: ``lean``); False, nothing changed, otherwise."""
        managers = self.managers
        plan = self.policy.make_room(managers, short, request_id)
        if plan is None:
            return False
        if not plan.holds_tail:
            assert plan.request_id == request_id, "only the stepping request gives its tail up"
            grid = self.policy.grid
            need = sum(
                m.get_num_blocks_to_allocate(
                    m.states[request_id], num_tokens, h, total_computed_tokens, (), grid, True
                )
                for m, h in zip(managers, hit, strict=True)
            )
            if need > self.pool.num_free_blocks:
                return False
        for m in managers:
            released = m.shed(m.states[plan.request_id], plan.kept, plan.holds_tail)
            self.pool.free_blocks(released, evict_first=True)
        return True

    def _nothing_to_do(
        self, states: list[RequestBlockState | None], num_tokens: int, total_computed: int
    ) -> bool:
        """The common decode case: every table already covers ``num_tokens``
        and no group has blocks to release (so no counting is needed)."""
        for m, st in zip(self.managers, states, strict=True):
            if st is None or num_tokens > len(st.blocks) * m.block_size:
                return False
            if m.has_skips and m.release_stop(st, total_computed) > st.num_skipped:
                return False
        return True

    def quiet_horizon(self, request_id: str) -> tuple[int, int, int]:
        """How far a live request can go with nothing to do in any group:
        ``(cover, release_at, cache_at)``. While the tokens needing slots stay
        ``<= cover``, the computed tokens ``< release_at`` and the tokens to
        cache ``< cache_at``, ``allocate`` and ``cache_blocks`` change nothing
        (each bound is never above the true one). Valid until the request's
        tables change (an ``allocate`` that acts, ``free``)."""
        cover = release_at = cache_at = NEVER
        for m in self.managers:
            st = m.states[request_id]
            bs = m.block_size
            cover = min(cover, len(st.blocks) * bs)
            release_at = min(release_at, m.next_release_at(st))
            cache_at = min(cache_at, (st.num_cached + 1) * bs)
        return cover, release_at, cache_at

    def cache_blocks(
        self,
        request_id: str,
        block_hashes: list[bytes],
        token_ids: list[int],
        num_tokens: int,
        lora_name: str | None,
    ) -> None:
        """Cache every group's full blocks covering ``num_tokens``."""
        for m in self.managers:
            st = m.states[request_id]
            if num_tokens // m.block_size > st.num_cached:
                m.cache_blocks(st, block_hashes, token_ids, num_tokens, lora_name)

    # -- prefix hits ---------------------------------------------------------
    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_length: int, token_ids: list[int] | None
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest hit valid for every group, and its length. Read-only."""

    # -- release -------------------------------------------------------------
    def free(
        self,
        request_id: str,
        block_hashes: list[bytes] | None = None,
        num_tokens: int | None = None,
    ) -> bool:
        """Release all of a request's blocks in the order its cache policy
        gives (``CachePolicy.release``); False if unknown.

        ``block_hashes``: the request's hash-block-size hashes; ``num_tokens``:
        its computed tokens (both passed on to the policy).
        """
        states = [m.pop_request(request_id) for m in self.managers]
        if states[0] is None:
            return False
        tables = list(zip(self.managers, states, strict=True))
        pool = self.pool
        for blocks, evict_first, value, held in self.policy.release(
            request_id,
            tables,  # type: ignore[arg-type]
            block_hashes,
            num_tokens,
        ):
            if blocks:
                free = pool.free_held_blocks if held else pool.free_blocks
                free(blocks, evict_first=evict_first, value=value)  # type: ignore[arg-type]
        return True

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        """Each group's block table of the request (empty if unknown)."""
        out = []
        for m in self.managers:
            st = m.states.get(request_id)
            out.append(st.blocks if st is not None else [])
        return tuple(out)

    def has_request(self, request_id: str) -> bool:
        """True while the request holds tables."""
        return request_id in self.managers[0].states

    def uncache_from(self, request_id: str, num_tokens: int) -> int:
        """Take the request's blocks past its first ``num_tokens`` out of the
        prefix cache (they were never computed); returns how many."""
        n = 0
        for m in self.managers:
            st = m.states.get(request_id)
            if st is None:
                continue
            for b in st.blocks[num_tokens // m.block_size :]:
                if not b.is_null and b.block_hash is not None:
                    self.pool.uncache(b)
                    n += 1
        return n

    def check_integrity(self) -> None:
        """Every manager's tables; all groups know the same requests; every
        block's ref count is its holders (tables and retained blocks); the
        policy's state."""
        ids = set(self.managers[0].states)
        holders: dict[int, int] = {}
        for m in self.managers:
            assert set(m.states) == ids, "groups disagree on the live requests"
            m.check_integrity()
            for st in m.states.values():
                for b in st.blocks + [b for _, b in st.retained]:
                    if not b.is_null:
                        holders[b.block_id] = holders.get(b.block_id, 0) + 1
        for rid in ids:
            self.growth.check_integrity([m.states[rid] for m in self.managers])
        for held in self.other_holders:
            for b in held():
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
        for b in self.pool.blocks[1:]:
            assert b.ref_cnt == holders.get(b.block_id, 0), (
                f"{b}: ref count {b.ref_cnt} != {holders.get(b.block_id, 0)} holders"
            )
        self.policy.check_integrity(ids)
