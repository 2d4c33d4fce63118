"""``HybridPolicy``: keep only what a later hit can use (``hybridkv.policy.retention``).

Built from the groups' geometry (block sizes, which tokens a query skips) and
``HybridOptions``. It owns the online learners: where requests branch
(``TailAlignment``, with its ``FineAlignment``), the prompts the cache has
seen (``SeenPrefixes``) and how often returning and first prompts are
continued (``ContinuationRates``, which scales the return bonus); the snapshot
floor's spacing is fixed by cost
(``floor_spacing``). Its hooks (``CachePolicy``) take plain data; it never
changes a manager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hybridkv.core.block import KVCacheBlock
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.managers.points import Hold
from hybridkv.policy.base import (
    Admission,
    CachePolicy,
    ComputeStores,
    ReleaseRun,
    Shed,
    Tables,
)
from hybridkv.policy.cost_aware import CostAwareEvictionPolicy, released_value, value_class
from hybridkv.policy.options import HybridOptions
from hybridkv.policy.release import release_hybrid
from hybridkv.policy.retention import FinalPoints, floor_spacing, prompt_point
from hybridkv.policy.returning import (
    ContinuationRates,
    SeenPrefixes,
    grade,
    host_return_share,
    host_value,
    sample_keys,
)
from hybridkv.policy.reuse_horizon import ReleaseTimes
from hybridkv.policy.shedding import held_end, make_room
from hybridkv.policy.tail_alignment import TailAlignment
from hybridkv.tiers.spare import SPARE


class HybridPolicy(CachePolicy):
    """Kept points, unit values and the learners behind them (module docstring).

    ``managers``: every group's manager, in group order (only their geometry
    is read); ``hash_block_size``: the request hashes' block size;
    ``num_blocks``: the pool's size; ``value_weight``: the free set's (0:
    recency only, then no returning prompts); ``ranks_by_value``: the free set
    orders released blocks by their value (else units go in order, no values);
    ``free_set``: the pool's cost-aware free set, whose reuse horizon the
    policy measures in its clock (``ReleaseTimes``; None: none measured).
    """

    name = "hybrid"
    keeps_points = True
    ranks_tiers = True

    def __init__(
        self,
        managers: Sequence[SingleTypeKVCacheManager],
        hash_block_size: int,
        num_blocks: int,
        options: HybridOptions,
        value_weight: float,
        ranks_by_value: bool,
        free_set: CostAwareEvictionPolicy | None = None,
    ) -> None:
        tuning = options.tuning
        self.options = options
        self.hash_block_size = hash_block_size
        sizes = [m.block_size for m in managers]
        self.block_sizes = sizes
        self.step = lcm = math.lcm(*sizes)
        #: Tokens before a freed request's end whose boundaries are tail points.
        self.tail = options.tail - options.tail % lcm
        #: The first full-attention group (its blocks mark prompt ends).
        self.full_gid = next((gid for gid, m in enumerate(managers) if m.prefix_closed), None)
        #: Hash blocks per full-attention block (its hashes: every ``k``-th, chained).
        self._full_stride = 1 if self.full_gid is None else managers[self.full_gid].hash_stride
        #: Where branches fall: thins the tail (``tail_alignment``).
        self.tail_alignment = TailAlignment(
            lcm if self.full_gid is None else sizes[self.full_gid],
            options.tail,
            options.tail_align,
            tuning,
        )
        groups = [(m.has_skips, m.block_size, m.first_needed_block) for m in managers]
        #: Tokens between two snapshot floor points (0: none): by cost, or set by hand.
        self.floor_tokens = floor_spacing(groups, lcm, tuning)
        if options.floor_tokens is not None:
            self.floor_tokens = lcm * -(-options.floor_tokens // lcm)
        #: Hits at multiples of this need nothing outside full attention: kept
        #: for free at release (0: no such points, e.g. a window).
        periods = [m.free_point_period() for m in managers]
        self.free_point_period = math.lcm(lcm, *periods) if all(periods) else 0
        # A running request holds what its last hit boundary below the tail
        # needs (``SingleTypeKVCacheManager.release_stop``): in a chunked group,
        # for the first ``tail`` tokens of each chunk, the whole chunk before
        # (8,192 tokens at Llama 4 Scout's size, per prefilling request). With
        # free points (every skipping group chunked), a tail point owns no block
        # a missing chunk could strand, and a group whose chunks start on the
        # hit step never has ``E`` in an earlier chunk: it holds no tail, so
        # only its current chunk. Only when every skipping group's chunks do:
        # a group that keeps a tail would otherwise hold blocks for a tail
        # point that another group's missing chunk makes no valid hit.
        held_tail = self.tail
        if self.free_point_period and all(
            m.free_point_period() % lcm == 0 for m in managers if m.has_skips
        ):
            held_tail = 0
        self._hold = Hold(held_tail, lcm)
        # Groups whose hit point needs one block of its own (a Mamba state):
        # only those are thinned in the tail (``UnitValues.of_other``).
        far = lcm << 20
        self.point_local = [
            m.has_skips and m.first_needed_block(far) == far // m.block_size - 1 for m in managers
        ]
        #: Returning prompts (with a full-attention group, a return bonus and a
        #: value-ranked free set): what the cache has held.
        #: The return bonus in force on the device, in its turnovers.
        self.return_bonus = bonus = options.bonus
        #: The share of a returning unit's return factor the host tier keeps:
        #: its own return bonus with a reach in tokens (``host_return_share``;
        #: 1.0 without).
        full_tokens = 0 if self.full_gid is None else num_blocks * sizes[self.full_gid]
        self.host_return_share = host_return_share(
            bonus, tuning.return_bonus_tokens, full_tokens, options.tier_cover
        )
        self.seen: SeenPrefixes | None = (
            SeenPrefixes(
                tuning.seen_per_block * num_blocks // tuning.sample_blocks,
                tuning.returning_share,
                tuning.sample_blocks,
                turns=options.return_grade != "flat",
                max_turn=tuning.max_turn,
            )
            if self.full_gid is not None and bonus > 0 and value_weight and tuning.learn_returning
            else None
        )
        #: A returning request's units are valued ``2 ** (bonus x grade(turn) / weight)``
        #: higher; ``return_factor`` is that factor at a grade of 1 (turn 1).
        self.return_factor = 2.0 ** (bonus / value_weight) if self.seen is not None else 1.0
        #: How often returning and first prompts are continued: scales the bonus.
        self.rates: ContinuationRates | None = (
            ContinuationRates(
                tuning.learn_window,
                tuning.learn_window,
                tuning.learn_min_observed,
                tuning.returning_share,
                tuning.sample_blocks,
                tuning.return_rate_full,
            )
            if self.seen is not None and tuning.learn_return_rates
            else None
        )
        self._grade = options.return_grade
        self._max_turn = tuning.max_turn
        self._returning: dict[str, int] = {}
        #: Reuse gaps for the free set's horizon (``hybridkv.policy.reuse_horizon``).
        self._free_set = free_set
        self.release_times: ReleaseTimes | None = (
            ReleaseTimes(
                tuning.seen_per_block * num_blocks // tuning.sample_blocks, tuning.sample_blocks
            )
            if free_set is not None and free_set.reuse is not None and self.full_gid is not None
            else None
        )
        self._ranks_by_value = ranks_by_value
        #: Each valued free block's return factor beside its value class, while
        #: the host keeps a share of it (``host_return_share`` < 1; else None):
        #: block -> (factor, the free set's class of its run's value).
        self._return_of: dict[KVCacheBlock, tuple[float, int]] | None = (
            {} if self.seen is not None and self.host_return_share < 1.0 else None
        )
        #: Both learners sample one block hash in this many (``sample_keys``).
        self._sample_blocks = tuning.sample_blocks

    # -- what managers hold --------------------------------------------------
    def hold(self, group_id: int) -> Hold:
        return self._hold

    @property
    def grid(self) -> int:
        return self.tail_alignment.align

    # -- admission -----------------------------------------------------------
    def kept_points(self, adm: Admission) -> tuple[int, ...]:
        """A new request's kept points: its hit, its branch point, its prompt's
        end and the snapshot floor below its end. The prompt's end is its last
        hit boundary, on the tail's grid when one is in force
        (``prompt_point``)."""
        lcm = self.step
        branch = min(adm.branch, adm.num_tokens - 1)
        branch -= branch % lcm
        step = self.floor_tokens
        floor = range(step, adm.num_tokens, step) if step else ()
        ta = self.tail_alignment
        prompt = prompt_point(adm.num_prompt_tokens, lcm, ta.align, ta.fine.align)
        return tuple(sorted({p for p in (adm.hit, branch, prompt, *floor) if p > 0}))

    def admit(self, adm: Admission) -> int | None:
        """The request was admitted: its returning turn (0: not returning; a
        resumed request keeps the answer of its first admission; None: no
        returning prompts are kept). A first
        admission's branch point and prompt feed the branch learners: a
        resumed request matches its own progress, no branch to learn from."""
        turn = adm.returning
        times, rates = self.release_times, self.rates
        if not adm.resumed and (times is not None or rates is not None):
            hashes = self._full_hashes(adm.block_hashes)
            if times is not None:
                fs = self._free_set
                assert fs is not None and fs.reuse is not None
                gap = times.gap(hashes, fs.clock)
                if gap is not None:
                    fs.reuse.observe(gap)
            if rates is not None:
                rates.observe(hashes)
        if self.seen is not None:
            if turn is None:
                turn = self._returning_turn(adm.block_hashes, adm.num_prompt_tokens)
            if turn:
                self._returning[adm.request_id] = turn
        if not adm.resumed:
            self._observe_branch(adm.branch, adm.num_tokens, adm.block_hashes, adm.packed_prompt)
            self._mark_prompt_end(adm.block_hashes, adm.num_prompt_tokens, adm.packed_prompt)
        return turn

    def _returning_turn(self, block_hashes: list[bytes], num_prompt_tokens: int) -> int:
        """The prompt's turn if it continues what the cache has held, else 0."""
        assert self.seen is not None and self.full_gid is not None
        bs = self.block_sizes[self.full_gid]
        return self.seen.returning(self._full_hashes(block_hashes), bs, num_prompt_tokens)

    def _full_hashes(self, block_hashes: list[bytes]) -> list[bytes]:
        """The full-attention group's block hashes from the request's."""
        k = self._full_stride
        return block_hashes if k == 1 else block_hashes[k - 1 :: k]

    def return_value(self, turn: int) -> float:
        """What a returning request's units are worth more, by its turn (1.0
        for turn 0: not returning)."""
        if not turn:
            return 1.0
        share = 1.0 if self.rates is None else self.rates.grade()
        return self.return_factor ** (share * grade(self._grade, turn, self._max_turn))

    def _observe_branch(
        self, branch: int, num_tokens: int, block_hashes: list[bytes], packed_prompt: bytes
    ) -> None:
        """A new request branches off the cache after ``branch`` tokens: feeds
        ``tail_alignment`` and its ``fine`` grid (with the hash of the block
        ending at ``branch``, when ``branch`` > 0, and the hashes of the blocks
        past it, cached or not)."""
        self.tail_alignment.observe(branch, num_tokens)
        h = self.hash_block_size
        key = block_hashes[branch // h - 1] if branch else None
        fine = self.tail_alignment.fine
        g = fine.granularity
        per = g // h  # hash blocks per full-attention block (h divides every block size)
        shared = (
            (b * g, block_hashes[b * per - 1])
            for b in range(branch // g + 1, len(block_hashes) // per + 1)
        )
        fine.observe(branch, key, packed_prompt, shared)

    def _mark_prompt_end(
        self, block_hashes: list[bytes], num_prompt_tokens: int, packed_prompt: bytes
    ) -> None:
        """Mark the full-attention block at or below the prompt's end, and
        record the block before that, for ``fine_alignment`` (nothing without
        full attention)."""
        if self.full_gid is None:
            return
        g = self.block_sizes[self.full_gid]
        end = num_prompt_tokens - num_prompt_tokens % g
        fine = self.tail_alignment.fine
        if end:
            fine.mark(block_hashes[end // self.hash_block_size - 1], num_prompt_tokens - end)
        if end > g:
            fine.record(block_hashes[(end - g) // self.hash_block_size - 1], packed_prompt, end - g)

    # -- release ---------------------------------------------------------------
    def release(
        self,
        request_id: str,
        tables: Tables,
        block_hashes: list[bytes] | None,
        num_tokens: int | None,
    ) -> list[ReleaseRun]:
        """Shared / dead (evict-first) / unit by unit with the unit's value
        (``release_hybrid``). The kept points are the request's own, its free
        points and ``E``, the end of what it cached, with the tail below ``E``
        unless the request gave it up to make room (``FinalPoints``)."""
        turn = self._returning.pop(request_id, 0)
        factor = self.return_value(turn)
        managers, states = zip(*tables, strict=True)
        if block_hashes is not None and (self.seen is not None or self.release_times is not None):
            # One sampling of the cached full-attention hashes for both learners.
            m, st = tables[self.full_gid]  # type: ignore[index]
            hashes = m.group_hashes(block_hashes)
            n = st.num_cached
            samples = sample_keys(hashes, n, self._sample_blocks)
            if self.release_times is not None:
                assert self._free_set is not None
                self.release_times.record_samples(samples, self._free_set.clock)
            if self.seen is not None:
                self.seen.record_samples(samples, turn)
                if self.rates is not None:
                    self.rates.record(hashes, m.block_size, n * m.block_size, bool(turn), n)
        lcm = self.step
        end = min([st.num_cached * m.block_size for m, st in tables])
        end -= end % lcm
        tail = self.tail
        if not states[0].holds_tail:  # given up (``alone_plan``): E's blocks may be gone
            end, tail = held_end(managers, states, end, self.free_point_period), 0
        points = FinalPoints(
            states[0].kept,
            end,
            tail,
            lcm,
            self.tail_alignment.align,
            self.free_point_period,
            num_tokens,
        )
        runs = release_hybrid(
            managers,
            states,
            points,
            self.point_local,
            factor,
            self._ranks_by_value,
            self.options.tuning.charge_tail_pages,
        )
        marks = self._return_of
        if marks is not None:  # the return factor goes beside each valued block's class
            for run in runs:
                if not run.evict_first and run.value is not None:
                    marks.update(dict.fromkeys(run.blocks, (factor, value_class(run.value))))
        return runs

    def demotion_value(self, block: KVCacheBlock) -> float | None:
        """The free set's class of the run's value; ``SPARE`` for a run released
        ``evict_first`` (a tier takes it into spare room only). While the host
        keeps only a share of the return bonus (``host_return_share`` < 1), the
        return factor the block was released with is rescaled to that share
        (``host_value``), its other class steps kept. The factor is taken only
        when the block's class is still the one its valued run gave it: a block
        freed since without a value (the engine's staged loads' held blocks, the
        neutral class 0) keeps its class's value, unless its run's class was 0
        too (a returning unit worth under 1.41 tokens a page: then the old factor
        is read)."""
        value = released_value(block)
        if value is None:
            return SPARE
        marks = self._return_of
        if marks is not None:
            mark = marks.get(block)
            if mark is not None and mark[1] == block.free_class:
                return host_value(value, mark[0], self.host_return_share)
        return value

    def store_on_compute(
        self, request_id: str, kept: tuple[int, ...], num_prompt_tokens: int
    ) -> ComputeStores | None:
        """The units of the request's kept points within its prompt (its hit, its
        branch point, its prompt's end, the snapshot floor below it): what another
        request on the same prompt resumes from. Their release value is not known
        while the request runs: they are worth the request's returning-turn value
        (1.0 for a first turn). The rest (its output, ``E``'s tail) waits for the
        release and its value (``store_value``)."""
        points = tuple(p for p in kept if p <= num_prompt_tokens)
        if not points:
            return None
        return ComputeStores(points, self.return_value(self._returning.get(request_id, 0)))

    def make_room(
        self, managers: Sequence[SingleTypeKVCacheManager], short: int, request_id: str
    ) -> Shed | None:
        return make_room(managers, short, request_id)

    def check_integrity(self, live: set[str]) -> None:
        self.tail_alignment.check_integrity()
        assert self._returning.keys() <= live, "a freed request is still marked returning"
        for learner in (self.seen, self.release_times):  # one sampling serves both
            if learner is not None:
                learner.check_integrity()
                assert learner.stride == self._sample_blocks, "learners sample different blocks"
        if self.rates is not None:
            self.rates.check_integrity()
        if self._return_of is not None:
            assert all(f >= 1.0 for f, _ in self._return_of.values()), "a return factor < 1"
