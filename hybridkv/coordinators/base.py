"""``KVCacheCoordinator``: drives every group's manager as one.

The coordinator makes multi-group operations atomic (count first, then act)
and defines the cross-group release order. Subclasses differ only in how a
prefix hit is found across groups.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from hybridkv.coordinators.hybrid_release import release_hybrid
from hybridkv.coordinators.shedding import make_room
from hybridkv.core.block import KVCacheBlock
from hybridkv.core.block_pool import BlockPool
from hybridkv.managers import SingleTypeKVCacheManager, get_manager_for_kv_cache_spec
from hybridkv.managers.base import NEVER, RequestBlockState
from hybridkv.managers.floor_tuner import FloorTuner
from hybridkv.managers.retention import FinalPoints, floor_point_cost, floor_spacing
from hybridkv.managers.returning import (
    RETURN_GRADE,
    RETURN_GRADES,
    SAMPLE_BLOCKS,
    SEEN_PER_BLOCK,
    SeenPrefixes,
)
from hybridkv.managers.tail_alignment import TailAlignment
from hybridkv.managers.tail_demand import AT_END, BELOW, OFF_GRID_END
from hybridkv.specs import KVCacheConfig


class KVCacheCoordinator(ABC):
    """All groups' managers over one block pool."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        block_pool: BlockPool,
        hash_block_size: int,
        enable_caching: bool,
        cache_policy: str = "lru",
        hybrid_tail_tokens: int = 0,
        hybrid_tail_align: int | None = 0,
        hybrid_return_bonus: float = 0.0,
        hybrid_return_grade: str = RETURN_GRADE,
    ) -> None:
        self.pool = block_pool
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.managers: list[SingleTypeKVCacheManager] = [
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec, block_pool, gid, hash_block_size, enable_caching
            )
            for gid, g in enumerate(kv_cache_config.kv_cache_groups)
        ]
        sizes = {m.block_size for m in self.managers}
        self.block_size_lcm = math.lcm(*sizes)
        # ``hybrid`` changes nothing for groups without skips (full attention only).
        self.hybrid = (
            cache_policy == "hybrid" and enable_caching and any(m.has_skips for m in self.managers)
        )
        tail = hybrid_tail_tokens - hybrid_tail_tokens % self.block_size_lcm
        #: Tokens before a freed request's end whose boundaries are tail points
        #: (``hybrid``; ``retention.TAIL_TOKENS``).
        self.tail = tail if self.hybrid else 0
        for m in self.managers:
            m.hybrid = self.hybrid
            m.tail = self.tail
            m.hit_step = self.block_size_lcm
        #: The first full-attention group (its blocks mark tail points).
        self._full_gid = next((gid for gid, m in enumerate(self.managers) if m.prefix_closed), None)
        #: Where branches fall (``hybrid``): thins the tail (``tail_alignment``).
        self.tail_alignment = TailAlignment(
            self.block_size_lcm
            if self._full_gid is None
            else self.managers[self._full_gid].block_size,
            hybrid_tail_tokens if self.hybrid else 0,
            hybrid_tail_align,
        )
        for m in self.managers:
            m.tail_alignment = self.tail_alignment
        #: Tokens between two snapshot floor points (``hybrid``; 0: none), and what
        #: moves it with the traffic (``floor_tuner``; ``None``: fixed).
        groups = [(m.has_skips, m.block_size, m.first_needed_block) for m in self.managers]
        self.floor_tokens = floor_spacing(groups, self.block_size_lcm) if self.hybrid else 0
        self.floor_tuner: FloorTuner | None = (
            FloorTuner(
                self.floor_tokens,
                floor_point_cost(groups, self.block_size_lcm),
                self.block_size_lcm,
            )
            if self.floor_tokens
            else None
        )
        #: Hits at multiples of this need nothing outside full attention: kept
        #: for free at ``free`` (``hybrid``; 0: no such points, e.g. a window).
        self.free_point_period = self._free_point_period() if self.hybrid else 0
        # A running request holds what its last hit boundary below the tail
        # needs (``SingleTypeKVCacheManager.release_stop``): in a chunked group,
        # for the first ``tail`` tokens of each chunk, the whole chunk before
        # (8,192 tokens at Llama 4 Scout's size, per prefilling request:
        # ``hybrid`` preempted 2.8x as often as ``lru``). With free points
        # (every skipping group chunked), a tail point owns no block a missing
        # chunk could strand, and a group whose chunks start on the hit step
        # never has ``E`` in an earlier chunk: it holds no tail, so only its
        # current chunk. (A group without skips holds nothing either way.)
        # Only when every skipping group's chunks do: a group that keeps a tail
        # would otherwise hold blocks for a tail point that another group's
        # missing chunk makes no valid hit (chunks of 3 and 6 tokens on a
        # 2-token step: a point at 4 needs the 6-token group's first chunk).
        if self.free_point_period and all(
            m.free_point_period() % self.block_size_lcm == 0 for m in self.managers if m.has_skips
        ):
            for m in self.managers:
                m.tail = 0
        # Groups whose hit point needs one block of its own (a Mamba state):
        # only those are thinned in the tail (``UnitValues.of_other``).
        far = self.block_size_lcm << 20
        self._point_local = [
            m.has_skips and m.first_needed_block(far) == far // m.block_size - 1
            for m in self.managers
        ]
        #: Returning prompts (``hybrid`` with a full-attention group and a
        #: return bonus): what the cache has held, and each live returning
        #: request's turn (``managers/returning.py``).
        weight = getattr(block_pool.policy, "weight", 0.0)
        self.seen: SeenPrefixes | None = (
            SeenPrefixes(
                SEEN_PER_BLOCK * kv_cache_config.num_blocks // SAMPLE_BLOCKS,
                turns=hybrid_return_grade != "flat",
            )
            if self.hybrid and self._full_gid is not None and hybrid_return_bonus > 0 and weight
            else None
        )
        #: A returning request's units are valued ``2 ** (bonus x grade(turn) / weight)``
        #: higher; ``return_factor`` is that factor at a grade of 1 (turn 1).
        self.return_factor = 2.0 ** (hybrid_return_bonus / weight) if self.seen is not None else 1.0
        self._return_grade = RETURN_GRADES[hybrid_return_grade]
        self._returning: dict[str, int] = {}
        #: Tokens the full-attention groups alone matched in the last
        #: ``find_longest_cache_hit`` (the branch point; without such groups, the hit).
        self.last_full_hit_tokens = 0
        self._no_hit: tuple[list[KVCacheBlock], ...] = tuple([] for _ in self.managers)

    def _free_point_period(self) -> int:
        """The common period of every group's free points (``free_point_period``), 0 if none."""
        periods = [m.free_point_period() for m in self.managers]
        if not all(periods):
            return 0
        return math.lcm(self.block_size_lcm, *periods)

    def observe_branch(
        self, branch: int, num_tokens: int, block_hashes: list[bytes], packed_prompt: bytes
    ) -> None:
        """A new request branches off the cache after ``branch`` tokens of its
        ``num_tokens`` (``block_hashes``: its hash-block-size hashes;
        ``packed_prompt``: its prompt as uint32). ``hybrid``: feeds
        ``tail_alignment``, its ``tail_demand`` (with the hash of the block
        ending at ``branch``, when ``branch`` > 0) and its ``fine`` grid (with
        the hashes of the blocks past ``branch`` as well, cached or not)."""
        self.tail_alignment.observe(branch, num_tokens)
        h = self.hash_block_size
        key = block_hashes[branch // h - 1] if branch else None
        if key is not None:
            self.tail_alignment.observe_key(key)
        fine = self.tail_alignment.fine
        g = fine.granularity
        per = g // h  # hash blocks per full-attention block (h divides every block size)
        shared = (
            (b * g, block_hashes[b * per - 1])
            for b in range(branch // g + 1, len(block_hashes) // per + 1)
        )
        fine.observe(branch, key, packed_prompt, shared)

    def mark_prompt_end(
        self, block_hashes: list[bytes], num_prompt_tokens: int, packed_prompt: bytes
    ) -> None:
        """An admitted request's prompt (``block_hashes``: its hash-block-size
        hashes; ``packed_prompt``: its tokens as uint32) ends
        ``num_prompt_tokens`` in: mark the full-attention block at or below its
        end, and record the block before that, for ``fine_alignment``
        (``hybrid``; nothing without full attention)."""
        if not self.hybrid or self._full_gid is None:
            return
        g = self.managers[self._full_gid].block_size
        end = num_prompt_tokens - num_prompt_tokens % g
        fine = self.tail_alignment.fine
        if end:
            fine.mark(block_hashes[end // self.hash_block_size - 1], num_prompt_tokens - end)
        if end > g:
            fine.record(block_hashes[(end - g) // self.hash_block_size - 1], packed_prompt, end - g)

    def is_returning(self, block_hashes: list[bytes], num_prompt_tokens: int) -> int:
        """A new request's turn if its prompt continues what the cache has
        held, else 0 (``SeenPrefixes.returning`` on the first full-attention
        group's blocks); 0 without ``seen``. Read-only."""
        if self.seen is None:
            return 0
        m = self.managers[self._full_gid]  # type: ignore[index]
        return self.seen.returning(m.group_hashes(block_hashes), m.block_size, num_prompt_tokens)

    def mark_returning(self, request_id: str, turn: int = 1) -> None:
        """The live request is returning, of ``turn`` (>= 1): its units are
        worth ``return_value(turn)`` more when freed."""
        assert self.seen is not None and self.has_request(request_id) and turn >= 1
        self._returning[request_id] = turn

    def return_value(self, turn: int) -> float:
        """What a returning request's units are worth more, by its turn (1.0
        for turn 0: not returning)."""
        return self.return_factor ** self._return_grade(turn) if turn else 1.0

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
        ``None`` if they do not fit, unless (``hybrid``, a running request's
        step) one live request can shed kept points to make them fit
        (``shedding``). Otherwise releases skipped blocks, adopts
        the hit blocks, extends the tables, and returns each group's new blocks.
        ``kept``: a new request's kept points (``hybrid`` policy).
        """
        managers = self.managers
        states = [m.states.get(request_id) for m in managers]
        if new_computed_blocks is None and self._nothing_to_do(
            states, num_tokens, total_computed_tokens
        ):
            return tuple([] for _ in managers)
        hit = new_computed_blocks or self._no_hit
        need = 0
        free = self.pool.num_free_blocks
        for m, st, h in zip(managers, states, hit, strict=True):
            need += m.get_num_blocks_to_allocate(st, num_tokens, h, total_computed_tokens, kept)
            if st is None and need > free:
                return None  # a new table's count is never negative: the rest only adds
        if need > free:
            # Only a running request's step gets here (a new table returned
            # above), and only it may take kept points instead (``shedding``).
            if not (self.hybrid and make_room(managers, self.pool, need - free)):
                return None
            need = sum(
                m.get_num_blocks_to_allocate(st, num_tokens, h, total_computed_tokens, kept)
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
        new = []
        for m, st, h in zip(managers, states, hit, strict=True):
            if st is None:
                st = m.add_request(request_id, h, kept)
            new.append(m.allocate_new_blocks(st, num_tokens))
        return tuple(new)

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
        """Release all of a request's blocks, tail first; False if unknown.

        ``block_hashes``: the request's hash-block-size hashes; with
        ``seen``, what its first full-attention group cached is recorded there.
        ``num_tokens``: its computed tokens (``hybrid``: an end whose grid point
        lies past them is off the grid, ``FinalPoints``).

        ``lru`` releases as vLLM 0.33 does, block for block: each group's table in
        turn (group order), tail first, one ``free_blocks`` call per group (the
        pool puts each call's hashless blocks at the head, so a later group's go
        before an earlier one's). ``hybrid`` orders by units (``_free_hybrid``).
        """
        states = [m.pop_request(request_id) for m in self.managers]
        if states[0] is None:
            return False
        if self.hybrid:
            turn = self._returning.pop(request_id, 0)
            factor = self.return_value(turn)
            if self.seen is not None and block_hashes is not None:
                m = self.managers[self._full_gid]  # type: ignore[index]
                st = states[self._full_gid]  # type: ignore[index]
                self.seen.record(m.group_hashes(block_hashes), st.num_cached, turn)  # type: ignore[union-attr]
            self._free_hybrid(states, factor, num_tokens)  # type: ignore[arg-type]
            return True
        free_blocks = self.pool.free_blocks
        for st in states:
            if st is not None:
                free_blocks(reversed(st.blocks[st.num_skipped :]))
        return True

    def _free_hybrid(
        self, states: list[RequestBlockState], factor: float = 1.0, num_tokens: int | None = None
    ) -> None:
        """``hybrid`` release (``hybridkv.coordinators.hybrid_release``);
        ``factor`` multiplies every unit's value (a returning request's).

        The kept points are the request's own, its free points and ``E``, the
        end of what it cached (``hybridkv.managers.retention``).
        """
        lcm = self.block_size_lcm
        end = min(st.num_cached * m.block_size for m, st in zip(self.managers, states, strict=True))
        end -= end % lcm
        ta = self.tail_alignment
        tail = self.tail
        d = ta.demand
        points = FinalPoints(
            states[0].kept,
            end,
            tail,
            lcm,
            ta.align,
            d.below_weight,
            d.end_weight,
            self.free_point_period,
            num_tokens,
        )
        if ta.align and self._full_gid is not None:
            self._mark_tail(states[self._full_gid], points)
        release_hybrid(self.managers, states, self.pool, points, self._point_local, factor)

    def _mark_tail(self, full: RequestBlockState, points: FinalPoints) -> None:
        """Mark each point of the freed request's aligned tail at the
        full-attention block ending there (``tail_demand``): its aligned end,
        the grid points below, an off-grid end above."""
        top, bs = points.top, self.managers[self._full_gid].block_size  # type: ignore[index]
        blocks = full.blocks
        mark = self.tail_alignment.demand.mark
        for p in points.tail:
            h = blocks[p // bs - 1].block_hash
            if h is not None:
                mark(h, AT_END if p == top else BELOW if p < top else OFF_GRID_END)

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

    def check_integrity(self) -> None:
        """Every manager's tables; all groups know the same requests."""
        ids = set(self.managers[0].states)
        for m in self.managers:
            assert set(m.states) == ids, "groups disagree on the live requests"
            assert m.tail_alignment is self.tail_alignment, "groups disagree on the tail"
            m.check_integrity()
        self.tail_alignment.check_integrity()
        if self.floor_tuner is not None:
            self.floor_tuner.check_integrity()
            assert self.floor_tokens == self.floor_tuner.spacing, "the floor is the tuner's"
        assert self._returning.keys() <= ids, "a freed request is still marked returning"
        if self.seen is not None:
            self.seen.check_integrity()
