"""Stateful property test: a toy scheduler drives ``KVCacheManager`` over random
hybrid configs (1-3 groups of full / sliding / chunked / Mamba, block sizes 1,
2 or 4) and every invariant of the pool, the tables and the prefix cache is
checked after every step, against shadow state and the hash-free reference
in ``reference.py``.

Runs under the Hypothesis profile named by ``HYPOTHESIS_PROFILE`` (see
``conftest.py``): ``ci`` (200 examples, default), ``dev`` (50) or ``thorough``
(10,000): ``HYPOTHESIS_PROFILE=thorough make test``.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import event
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from reference import (
    MAX_PROMPT,
    VOCAB,
    Config,
    NaiveStore,
    cdiv,
    check_hybrid_release,
    check_release_order,
    configs,
    snapshot,
    usable_keys,
)
from release_log import ReleaseLog

from hybridkv import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheBlock,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    Request,
)
from hybridkv.policy.options import RETURN_GRADE_NAMES
from hybridkv.policy.tuning import DEFAULT_TUNING as T

MAX_REQUESTS = 8  # live + waiting at once

MAX_TURN, RETURNING_SHARE, SEEN_PER_BLOCK = T.max_turn, T.returning_share, T.seen_per_block


@dataclass
class Tracked:
    """A request and what the toy scheduler knows about it."""

    req: Request
    hit: int = 0  # prefix-hit length at its last admission (first computed token)
    last_tc: int = 0  # tokens computed before its last successful allocate_slots
    recorded: list[int] = field(default_factory=list)  # shadowed hashes per group
    returning: int | None = None  # the model's answer (its turn, 0: not) at its first admission


class KVCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv: KVCacheManager | None = None
        self.waiting: list[Tracked] = []
        self.running: list[Tracked] = []
        self.num_created = 0
        # (group, hash) -> (salt, lora, token prefix up to the block's end)
        self.shadow: dict[tuple[int, bytes], tuple[str | None, str | None, tuple[int, ...]]] = {}
        self.mirror: Counter[tuple[int, bytes]] = Counter()  # rebuilt from KV events
        self.evicted = False  # a cached block was evicted since the last reset

    @initialize(cfg=configs(), data=st.data())
    def setup(self, cfg: Config, data: st.DataObject) -> None:
        self.cfg = cfg
        self.groups = cfg.groups
        self.sizes = [g.block_size for g in cfg.groups]
        self.hash_bs = math.gcd(*self.sizes)
        self.store = NaiveStore(cfg.groups)
        config = KVCacheConfig(
            num_blocks=cfg.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec([f"l{g}"], d.spec()) for g, d in enumerate(self.groups)
            ],
        )
        # How the returning bonus grows with the turn (only turns are modelled:
        # the values it gives are checked by hand in tests/test_returning.py).
        self.grade = data.draw(st.sampled_from(sorted(RETURN_GRADE_NAMES)), label="return grade")
        # The shipped memory samples one block in ``sample_blocks`` (8): these
        # prompts are a few blocks long, so the tuning takes a drawn stride
        # (tests/test_returning.py checks the shipped one).
        self.seen_stride = data.draw(st.integers(1, 3), label="seen stride")
        self.kv = KVCacheManager(
            config,
            cfg.max_model_len,
            enable_caching=cfg.enable_caching,
            hash_algo=cfg.hash_algo,
            enable_kv_cache_events=True,
            log_stats=True,
            cache_policy=cfg.cache_policy,
            hybrid_tail_tokens=cfg.hybrid_tail_tokens,
            hybrid_value_weight=cfg.hybrid_value_weight,
            hybrid_tail_align=cfg.hybrid_tail_align,
            hybrid_return_grade=self.grade,
            hybrid_tuning={"sample_blocks": self.seen_stride},
        )
        self.hybrid = self.kv.coordinator.hybrid
        # Returning prompts, modelled: the first full-attention group's hashes
        # that freed requests cached, most recent last (``policy/returning.py``).
        self.full_gid = next((g for g, d in enumerate(self.groups) if d.kind == "full"), None)
        # Two generations, newer first (``SeenPrefixes``): a generation that
        # grows past half the capacity becomes the older one. Each hash maps to
        # the turn of the request that cached it.
        self.seen_model: list[dict[bytes, int]] | None = (
            [{}, {}]
            if self.hybrid and self.full_gid is not None and cfg.hybrid_value_weight != 0
            else None
        )
        assert (getattr(self.kv.policy, "seen", None) is None) == (self.seen_model is None)
        seen = getattr(self.kv.policy, "seen", None)
        if seen is not None:
            assert seen.stride == self.seen_stride
            assert seen.capacity == SEEN_PER_BLOCK * cfg.num_blocks // self.seen_stride
        self.log: ReleaseLog | None = None
        if self.hybrid:  # watch the dead blocks (``release_log.py``)
            pool = self.kv.block_pool
            self.log = ReleaseLog(pool.policy, self._dead)
            pool.policy = self.log  # type: ignore[assignment]
        for _ in range(data.draw(st.integers(1, 4))):  # rules may be swarm-disabled
            self._arrive(data)

    # -- helpers -------------------------------------------------------------
    @property
    def manager(self) -> KVCacheManager:
        assert self.kv is not None
        return self.kv

    def _ids(self) -> list[str]:
        return [t.req.request_id for t in self.running + self.waiting]

    def _recorded(self, tokens: list[int]) -> list[int] | None:
        """What a cached block records of its tokens: them with a non-cryptographic
        hash (checked on hits), nothing with sha256 (the shadow checks content)."""
        return None if self.cfg.hash_algo == "sha256" else tokens

    def _group_hash(self, hashes: list[bytes], g: int, i: int) -> bytes:
        k = self.sizes[g] // self.hash_bs
        return hashes[(i + 1) * k - 1]

    def _record_hashes(self, t: Tracked) -> None:
        """Shadow every (group, hash) of the request; a hash never names two prefixes."""
        req = t.req
        hashes = req.block_hashes
        tokens = list(req.all_token_ids)
        for g, bs in enumerate(self.sizes):
            k = bs // self.hash_bs
            for i in range(t.recorded[g], len(hashes) // k):
                key = (req.cache_salt, req.lora_name, tuple(tokens[: (i + 1) * bs]))
                seen = self.shadow.setdefault((g, hashes[(i + 1) * k - 1]), key)
                assert seen == key, f"group {g}: one hash for two prefixes {seen} / {key}"
            t.recorded[g] = len(hashes) // k

    def _check_chain(self, ev: BlockStored) -> None:
        """A stored run is one chain: each block extends its parent by its own tokens."""
        g, bs = ev.group_id, ev.block_size
        assert bs == self.sizes[g] and len(ev.token_ids) == bs * len(ev.block_hashes)
        prefix = () if ev.parent_block_hash is None else self.shadow[(g, ev.parent_block_hash)][2]
        for j, h in enumerate(ev.block_hashes):
            prefix = (*prefix, *ev.token_ids[j * bs : (j + 1) * bs])
            assert self.shadow[(g, h)][2] == prefix, f"group {g}: stored run is not one chain"

    def _sync_events(self) -> None:
        for ev in self.manager.take_events():
            if isinstance(ev, BlockStored):
                self._check_chain(ev)
                self.mirror.update((ev.group_id, h) for h in ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                self.mirror.subtract((ev.group_id, h) for h in ev.block_hashes)
                self.evicted = True
            else:
                assert isinstance(ev, AllBlocksCleared)
                self.mirror.clear()
                self.evicted = False

    def _dead(self, blocks: list[KVCacheBlock]) -> list[bool]:
        """Which of ``blocks`` are cached and used by no valid hit, per the
        hash-free reference over the pool's cached token prefixes."""
        if all(b.block_hash is None for b in blocks):
            return [False] * len(blocks)
        cached = {
            (b.group_id, *self.shadow[(b.group_id, b.block_hash)])
            for b in self.manager.block_pool.blocks
            if b.block_hash is not None and b.group_id is not None
        }
        usable = usable_keys(self.groups, cached)
        return [
            b.block_hash is not None
            and b.group_id is not None
            and (b.group_id, *self.shadow[(b.group_id, b.block_hash)]) not in usable
            for b in blocks
        ]

    def _pick(self, data: st.DataObject, pool: list[Tracked]) -> Tracked:
        return pool[data.draw(st.integers(0, len(pool) - 1))]

    def _allocate(
        self,
        t: Tracked,
        num_new: int,
        token: int,
        hit: int = 0,
        hit_blocks: KVCacheBlocks | None = None,
    ) -> bool:
        kv, req = self.manager, t.req
        before = snapshot(kv, self._ids())
        old_len = [len(tab) for tab in kv.get_block_ids(req.request_id)]
        tc = req.num_computed_tokens + hit
        need, shared_skips = self._net_need(t, num_new, hit, hit_blocks)
        free = kv.block_pool.num_free_blocks
        kept_before = self._kept_points()
        out = kv.allocate_slots(req, num_new, hit, hit_blocks)
        if not self.hybrid:  # the independent count models lru's release rules
            assert (out is None) == (need > free), f"net need {need}, {free} free, got {out}"
        if need - shared_skips <= free < need:
            event("out of blocks unless skipped blocks held by others were freed")
        if out is None:
            event("allocate_slots -> None")
            assert snapshot(kv, self._ids()) == before, "failed allocate_slots changed state"
            return False
        self._check_shedding(kept_before, req.request_id, admission=hit_blocks is not None)
        if hit_blocks is not None:
            self._check_returning(t)
        tables = kv.get_block_ids(req.request_id)
        if hit_blocks is not None and hit:
            old_len = [len(tab) for tab in hit_blocks.blocks]
            assert [tab[:n] for tab, n in zip(tables, old_len, strict=True)] == list(
                hit_blocks.get_block_ids()
            ), "the table does not start with the hit blocks"
        assert len(out.blocks) == len(self.groups)
        for g, tab in enumerate(tables):
            new = [b for b in tab[old_len[g] :] if b]
            assert out.get_block_ids()[g] == new, f"group {g}: returned {out}, table {tab}"
        for b in out.blocks:
            assert all(x.ref_cnt == 1 for x in b), "fresh blocks must have ref count 1"
        req.num_computed_tokens = tc + num_new
        t.last_tc = tc
        if self.cfg.enable_caching:
            tokens = list(req.all_token_ids)
            self.store.add_computed(req.cache_salt, req.lora_name, tokens, t.hit, tc + num_new)
        if req.num_computed_tokens == req.num_tokens < self.cfg.max_model_len:
            req.append_output_token_ids(token)  # sampled; computed by the next step
        self._record_hashes(t)
        return True

    def _check_returning(self, t: Tracked) -> None:
        """After an admission: a first one decides ``returning`` as the model
        does (the blocks covering half the prompt, from its start, all seen);
        a resumed request keeps its answer; the coordinator marks exactly the
        live returning requests."""
        req = t.req
        marked = req.request_id in getattr(self.manager.policy, "_returning", {})
        if self.seen_model is None:
            assert req.returning is None and not marked
            return
        if t.returning is None:
            g = self.full_gid
            assert g is not None
            need = max(1, math.ceil(RETURNING_SHARE * req.num_prompt_tokens / self.sizes[g]))
            whole = req.num_prompt_tokens // self.sizes[g]
            # The samples end runs of ``seen_stride`` blocks; a hash being
            # chained, the one ending the run that covers ``need`` decides.
            stride = self.seen_stride
            last = -(-need // stride) * stride - 1
            held = None
            if last < whole:
                key = self._group_hash(req.block_hashes, g, last)
                held = self.seen_model[0].get(key, self.seen_model[1].get(key))
            if held is None:
                t.returning = 0
            else:  # without turns kept (flat), every returning request is turn 1
                t.returning = 1 if self.grade == "flat" else min(held + 1, MAX_TURN)
            event(f"first admission, returning: {bool(t.returning)}")
            if t.returning > 1:
                event("first admission: a returning request past its first turn")
        assert req.returning == t.returning, f"returning {req.returning}, model {t.returning}"
        assert getattr(self.manager.policy, "_returning", {}).get(req.request_id, 0) == t.returning
        assert marked == bool(t.returning)

    def _kept_points(self) -> dict[str, tuple[tuple[int, ...], bool]]:
        """Each live request's kept points and whether it holds its tail
        (``hybrid``; the same in every group)."""
        managers = self.manager.coordinator.managers
        out = {rid: (st.kept, st.holds_tail) for rid, st in managers[0].states.items()}
        for m in managers[1:]:
            assert {rid: (st.kept, st.holds_tail) for rid, st in m.states.items()} == out
        return out

    def _check_shedding(
        self, before: dict[str, tuple[tuple[int, ...], bool]], stepping: str, admission: bool
    ) -> None:
        """After a successful allocation: at most one live request gave up
        kept points (``policy.shedding``), never for an admission, only
        points behind its window in some group, and it retains nothing now,
        unless it is the request that stepped: its window moved on after the
        shed, past points it still keeps (``check_integrity``: every retained
        block is a kept point's). Or the request that stepped, alone, gave up
        every kept point and its tail (``shedding.alone_plan``)."""
        after = self._kept_points()
        shed = [rid for rid, kept in before.items() if rid in after and after[rid] != kept]
        if not shed:
            return
        event("hybrid: a running request shed kept points")
        assert self.hybrid and not admission and len(shed) == 1, f"shed by {shed}"
        rid = shed[0]
        (kept_before, tail_before), (kept_after, tail_after) = before[rid], after[rid]
        if tail_before and not tail_after:
            event("hybrid: a lone request gave up its kept points and its tail")
            assert rid == stepping and list(after) == [rid] and kept_after == (), after
            assert not any(m.states[rid].retained for m in self.manager.coordinator.managers)
            return
        assert tail_before == tail_after, f"{rid} took its tail back"
        dropped = set(kept_before) - set(kept_after)
        assert dropped and set(kept_after) <= set(kept_before), (kept_before, kept_after)
        for p in dropped:
            assert any(
                m.has_skips and m.first_needed_block(p) < m.states[rid].num_skipped
                for m in self.manager.coordinator.managers
            ), f"{rid} shed kept point {p}, which is not behind its window"
        if rid != stepping:
            event("hybrid: another request shed kept points")
            for m in self.manager.coordinator.managers:
                assert not m.states[rid].retained, f"{rid} shed but retains blocks"

    def _holders(self) -> Counter[int]:
        """Block id -> how many running requests hold it (the test's own view)."""
        kv = self.manager
        return Counter(
            b for t in self.running for tab in kv.get_block_ids(t.req.request_id) for b in tab if b
        )

    def _net_need(
        self, t: Tracked, num_new: int, hit: int, hit_blocks: KVCacheBlocks | None
    ) -> tuple[int, int]:
        """Net free blocks an allocation takes, counted independently of the manager:
        new table entries, plus hit blocks that leave the free set (nobody holds
        them), minus blocks the query no longer reads that no other request holds.
        Also returns how many such no-longer-read blocks another request still holds.
        """
        kv, req = self.manager, t.req
        holders = self._holders()
        running = t in self.running
        if running:
            tables = kv.get_block_ids(req.request_id)
        elif hit_blocks is not None:
            tables = hit_blocks.get_block_ids()
        else:
            tables = tuple([] for _ in self.groups)
        tc = req.num_computed_tokens + hit
        need = shared = 0
        for d, tab in zip(self.groups, tables, strict=True):
            required = cdiv(tc + num_new, d.block_size)
            if required > len(tab):
                # Mamba without prefix caching fills only the last new entry.
                only_last = d.kind == "mamba" and not self.cfg.enable_caching
                need += 1 if only_last else required - len(tab)
            if not running:
                need += sum(1 for b in tab if b and holders[b] == 0)
                continue
            skipped = [b for b in tab[: d.first_needed_block(tc)] if b]
            need -= sum(1 for b in skipped if holders[b] == 1)
            shared += sum(1 for b in skipped if holders[b] > 1)
        return need, shared

    def _chunk(
        self,
        data: st.DataObject,
        t: Tracked,
        rest: int,
        hit: int = 0,
        hit_blocks: KVCacheBlocks | None = None,
    ) -> int:
        """Tokens to compute next: all ``rest``, a random chunk, or a chunk at the edge
        of the pool (net need equal to the free blocks, or one more: must fail)."""
        mode = data.draw(st.sampled_from(["rest", "random", "edge"]))
        if mode == "edge":
            free = self.manager.block_pool.num_free_blocks
            edge = [
                n
                for n in range(1, rest + 1)
                if self._net_need(t, n, hit, hit_blocks)[0] - free in (0, 1)
            ]
            if edge:
                return data.draw(st.sampled_from(edge))
            event("no chunk at the edge of the free blocks")
        return rest if mode == "rest" else data.draw(st.integers(1, rest))

    def _check_hit(self, t: Tracked, blocks: KVCacheBlocks, hit: int) -> None:
        req = t.req
        assert len(blocks.blocks) == len(self.groups)
        assert 0 <= hit <= req.num_tokens - 1
        if not self.cfg.enable_caching:
            assert hit == 0 and not any(blocks.blocks)
            return
        hashes = req.block_hashes
        tokens = list(req.all_token_ids)
        for g, d in enumerate(self.groups):
            bs = d.block_size
            assert len(blocks.blocks[g]) * bs == hit, f"group {g}: hit {hit} not covered"
            first = d.first_needed_block(hit)
            for i, b in enumerate(blocks.blocks[g]):
                assert b.is_null == (i < first), f"group {g} pos {i}: null iff outside window"
                if b.is_null:
                    continue
                h = self._group_hash(hashes, g, i)
                assert b.block_hash == h and b.group_id == g, f"group {g} pos {i}: wrong key"
                assert b.token_ids == self._recorded(tokens[i * bs : (i + 1) * bs]), "other tokens"
                # Salt isolation: the hash was made by this salt / LoRA / prefix only.
                key = (req.cache_salt, req.lora_name, tuple(tokens[: (i + 1) * bs]))
                assert self.shadow[(g, h)] == key, (self.shadow[(g, h)], key)
        naive = self.store.longest_hit(req.cache_salt, req.lora_name, tokens)
        # Coverage, shown by ``pytest --hypothesis-show-statistics``.
        event(f"prefix hit: {'yes' if hit else 'no'}, evicted since reset: {self.evicted}")
        if hit < naive:
            event("hit below the naive reference (after evictions)")
        assert hit <= naive, f"hit {hit} > naive reference {naive}"
        # ``hybrid`` keeps Mamba states only at kept points; everything else is
        # cached as under ``lru`` until an eviction.
        exact = not (self.hybrid and any(d.kind == "mamba" for d in self.groups))
        if not self.evicted and exact:
            assert hit == naive, f"hit {hit} != naive reference {naive} (no eviction)"

    def _free(self, t: Tracked) -> None:
        kv, rid = self.manager, t.req.request_id
        pool = kv.block_pool
        tables = kv.get_block_ids(rid)
        old_queue = [b.block_id for b in pool.policy]
        released = [
            (g, i, b, pool.blocks[b].block_hash is not None)
            for g, tab in enumerate(tables)
            for i, b in enumerate(tab)
            if b and pool.blocks[b].ref_cnt == 1
        ]
        released += [
            (g, i, blk.block_id, blk.block_hash is not None)
            for g, m in enumerate(kv.coordinator.managers)
            for i, blk in m.states[rid].retained
            if blk.ref_cnt == 1
        ]
        cached_full = []
        if self.seen_model is not None:
            g = self.full_gid
            assert g is not None
            n = kv.coordinator.managers[g].states[rid].num_cached
            cached_full = [
                self._group_hash(t.req.block_hashes, g, i)
                for i in range(self.seen_stride - 1, n, self.seen_stride)
            ]
        assert kv.free(t.req) is True
        assert kv.free(t.req) is False, "freeing a freed request must be a no-op"
        if self.seen_model is not None:
            half = SEEN_PER_BLOCK * self.cfg.num_blocks // self.seen_stride // 2
            newer = self.seen_model[0]
            newer.update(dict.fromkeys(cached_full, t.returning or 0))
            if len(newer) > half:
                event("seen prefixes: a generation turned over")
                self.seen_model[:] = [{}, newer]
        new_queue = [b.block_id for b in pool.policy]
        if self.hybrid:
            keys = {
                b.block_id: b.evict_key
                for b in pool.policy
                if getattr(b, "free_class", None) is not None
            }
            check_hybrid_release(old_queue, new_queue, released, keys)
        else:
            check_release_order(old_queue, new_queue, released)
        self.running.remove(t)

    # -- rules ---------------------------------------------------------------
    @precondition(lambda self: len(self.waiting) + len(self.running) < MAX_REQUESTS)
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        self._arrive(data)

    @precondition(
        lambda self: (
            len(self.waiting) + len(self.running) < MAX_REQUESTS
            and any(t.req.num_computed_tokens for t in self.running)
        )
    )
    @rule(data=st.data())
    def branch(self, data: st.DataObject) -> None:
        """A new request continues what a running one computed so far (a branch of a
        conversation): its prefix hit shares blocks the running request still holds."""
        req = self._pick(data, [t for t in self.running if t.req.num_computed_tokens]).req
        self._arrive(data, list(req.all_token_ids)[: req.num_computed_tokens], req)

    def _arrive(
        self, data: st.DataObject, prefix: list[int] | None = None, like: Request | None = None
    ) -> None:
        """A new request (a shared prefix plus a random suffix) tries to start;
        with ``like``, under that request's salt and LoRA."""
        if prefix is None:
            prefix = data.draw(st.sampled_from([*self.cfg.prefixes * 3, []]))  # []: 1-12 tokens
        suffix = data.draw(
            st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=self.cfg.max_suffix)
        )
        if like is not None:
            salt, lora = like.cache_salt, like.lora_name
        else:
            salt = data.draw(st.sampled_from([None, None, "s1", "s2"]))
            lora = data.draw(st.sampled_from([None, None, None, "lora-a"]))
        self.num_created += 1
        tokens = (prefix + suffix)[:MAX_PROMPT]
        req = Request(f"r{self.num_created}", tokens, cache_salt=salt, lora_name=lora)
        t = Tracked(req, recorded=[0] * len(self.groups))
        self.waiting.append(t)
        self._admit(t, data)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        """A waiting (preempted, or earlier out of blocks) request tries to start."""
        self._admit(self._pick(data, self.waiting), data)

    def _admit(self, t: Tracked, data: st.DataObject) -> None:
        kv, req = self.manager, t.req
        self._sync_events()
        before = snapshot(kv, self._ids())
        blocks, hit = kv.get_computed_blocks(req)
        assert snapshot(kv, self._ids()) == before, "get_computed_blocks changed the cache"
        stats = kv.make_prefix_cache_stats()
        assert stats is not None
        if self.cfg.enable_caching:
            if req.num_preemptions:
                got = (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits)
            else:
                got = (stats.requests, stats.queries, stats.hits)
            assert got == (1, req.num_tokens, hit), f"stats {stats} for hit {hit}"
        else:
            assert stats.hits == stats.preempted_hits == 0
        self._record_hashes(t)
        self._check_hit(t, blocks, hit)
        rest = req.num_tokens - hit
        num_new = self._chunk(data, t, rest, hit, blocks)
        t.hit = hit
        token = data.draw(st.integers(0, VOCAB - 1))
        # Like a scheduler with a token budget: out of blocks, retry a 1-token chunk.
        if self._allocate(t, num_new, token, hit, blocks) or (
            num_new > 1 and self._allocate(t, 1, token, hit, blocks)
        ):
            self.waiting.remove(t)
            self.running.append(t)

    @precondition(
        lambda self: any(t.req.num_computed_tokens < t.req.num_tokens for t in self.running)
    )
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """A prefill chunk, or a decode step (the one sampled token) when rest == 1."""
        t = self._pick(
            data, [t for t in self.running if t.req.num_computed_tokens < t.req.num_tokens]
        )
        rest = t.req.num_tokens - t.req.num_computed_tokens
        num_new, token = self._chunk(data, t, rest), data.draw(st.integers(0, VOCAB - 1))
        if not self._allocate(t, num_new, token) and num_new > 1:
            self._allocate(t, 1, token)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self._free(self._pick(data, self.running))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        t = self._pick(data, self.running)
        self._free(t)
        t.req.num_computed_tokens = 0
        t.req.num_preemptions += 1
        self.waiting.append(t)

    @rule()
    def reset_prefix_cache(self) -> None:
        kv = self.manager
        self._sync_events()
        before = snapshot(kv, self._ids())
        ok = kv.reset_prefix_cache()
        assert ok == (not self.running), f"reset returned {ok} with {len(self.running)} running"
        event(f"reset_prefix_cache -> {ok}")
        if ok:
            self.store.clear()
            assert kv.block_pool.num_cached_blocks() == 0
            assert all(b.block_hash is None for b in kv.block_pool.blocks)
        else:
            assert snapshot(kv, self._ids()) == before, "a failed reset changed state"

    @rule()
    def drain(self) -> None:
        """Free every running request: nothing may leak."""
        for t in list(self.running):
            self._free(t)
        kv = self.manager
        assert kv.block_pool.num_free_blocks == self.cfg.num_blocks - 1, "blocks leaked"
        assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks[1:]), "ref counts leaked"
        assert kv.usage == 0.0

    def teardown(self) -> None:
        if self.kv is not None and sys.exc_info()[0] is None:  # not after a failed step
            self.drain()
            self.check_all()

    # -- invariants ----------------------------------------------------------
    def _check_table(self, t: Tracked, tables: tuple[list[int], ...], hashes: list[bytes]) -> None:
        """Table shape: skipped blocks null, the rest real; full computed blocks cached."""
        req, blocks = t.req, self.manager.block_pool.blocks
        n, tc = req.num_computed_tokens, t.last_tc
        tokens = list(req.all_token_ids)
        caching = self.cfg.enable_caching
        for g, (d, tab) in enumerate(zip(self.groups, tables, strict=True)):
            bs = d.block_size
            assert len(tab) == cdiv(n, bs), f"{req.request_id} group {g}: table {tab}, n={n}"
            if self.hybrid:
                m = self.manager.coordinator.managers[g]
                tail = m.tail if m.states[req.request_id].holds_tail else 0  # given up: lru's
                must, may = d.hybrid_positions(tc, len(tab), tail, self.store.step)
                got = {i for i, bid in enumerate(tab) if bid}
                assert must <= got <= may, f"{req.request_id} group {g}: table {tab}, tc={tc}"
            else:
                real = d.real_positions(tc, len(tab), caching)
            for i, bid in enumerate(tab):
                if not self.hybrid:
                    assert (bid != 0) == (i in real), f"{req.request_id} group {g}: table {tab}"
                if bid == 0:
                    continue
                b = blocks[bid]
                if caching and (i + 1) * bs <= n:
                    assert b.block_hash == self._group_hash(hashes, g, i) and b.group_id == g
                    assert b.token_ids == self._recorded(tokens[i * bs : (i + 1) * bs])
                else:
                    assert b.block_hash is None, f"{b} cached before it was full and computed"

    @invariant()
    def check_all(self) -> None:
        if self.kv is None:
            return
        kv = self.kv
        pool = kv.block_pool
        self._sync_events()
        kv.check_integrity()
        if self.log is not None:
            assert not self.log.problems, self.log.problems
            if self.log.kept_evictions:
                event(
                    f"hybrid: evicted a block worth keeping, dead ones seen: {self.log.seen_dead}"
                )
        # Ref counts from the test's own view of the live requests' tables.
        holders: Counter[int] = Counter()
        group_of: dict[int, int] = {}
        for t in self.running:
            tables = kv.get_block_ids(t.req.request_id)
            for g, m in enumerate(kv.coordinator.managers):  # hybrid: kept points' blocks
                for i, blk in m.states[t.req.request_id].retained:
                    assert tables[g][i] == 0 and self.hybrid, f"retained {blk} still in table"
                    holders[blk.block_id] += 1
            ids = [b for tab in tables for b in tab if b]
            assert ids, f"{t.req.request_id} is running but holds no block"
            assert len(ids) == len(set(ids)), f"{t.req.request_id} holds a block twice"
            for g, tab in enumerate(tables):
                for b in tab:
                    if b:
                        holders[b] += 1
                        assert group_of.setdefault(b, g) == g, f"block {b} in two groups"
            self._check_table(t, tables, t.req.block_hashes)
        for t in self.waiting:
            assert kv.get_block_ids(t.req.request_id) == tuple([] for _ in self.groups)
        for b in pool.blocks[1:]:
            assert b.ref_cnt == holders[b.block_id], f"{b}: {holders[b.block_id]} holders"
        # The free queue holds exactly the ref-0 non-null blocks.
        queue = list(pool.policy)
        free_ids = sorted(b.block_id for b in queue)
        assert free_ids == [b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0]
        # Accounting: free (cached-free + uncached-free) + in use == N - 1.
        n_free = pool.num_free_blocks
        in_use = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
        assert in_use == len(holders)
        assert n_free + in_use == self.cfg.num_blocks - 1, (n_free, in_use)
        cached = [b for b in pool.blocks if b.block_hash is not None]
        cached_free = sum(1 for b in cached if b.ref_cnt == 0)
        uncached_free = sum(1 for b in pool.blocks[1:] if b.ref_cnt == 0 and b.block_hash is None)
        assert n_free == cached_free + uncached_free == len(queue)
        assert pool.num_cached_blocks() == cached_free + sum(1 for b in cached if b.ref_cnt)
        assert math.isclose(kv.usage, in_use / (self.cfg.num_blocks - 1))
        # The prefix index: every cached block matches the shadow copy.
        indexed = [(g, h, b) for g, idx in enumerate(pool.cached) for h, b in idx.items()]
        indexed += [(g, h, b) for (g, h), d in pool.duplicates.items() for b in d.values()]
        assert sorted(b.block_id for _, _, b in indexed) == [b.block_id for b in cached]
        if not self.cfg.enable_caching:
            assert not cached, "a block was cached with prefix caching off"
        for g, h, b in indexed:
            assert (g, h) in self.shadow, f"{b} cached under a hash no request produced"
            prefix = self.shadow[(g, h)][2]
            bs = self.sizes[g]
            assert len(prefix) % bs == 0 and b.token_ids == self._recorded(list(prefix[-bs:])), b
        # KV events mirror the index's keys exactly: every cached key stored once
        # (duplicate blocks are silent), nothing removed that was not stored.
        assert not -self.mirror, "a key was removed more often than stored"
        keys = {(b.group_id, b.block_hash) for b in cached}
        assert +self.mirror == Counter(keys), "events drifted"
        assert keys == pool.cached_keys()


TestKVCacheStateMachine = KVCacheMachine.TestCase


class KVCacheMachineUnderPressure(KVCacheMachine):
    """The same machine on tiny pools with shared sliding-window prefixes."""

    @initialize(cfg=configs(pressure=True), data=st.data())
    def setup(self, cfg: Config, data: st.DataObject) -> None:
        super().setup(cfg, data)


TestKVCacheStateMachineUnderPressure = KVCacheMachineUnderPressure.TestCase


class KVCacheMachineHybridUnderPressure(KVCacheMachine):
    """The pressure configs under ``hybrid``: dead blocks and evictions at once."""

    @initialize(cfg=configs(pressure=True, policy="hybrid"), data=st.data())
    def setup(self, cfg: Config, data: st.DataObject) -> None:
        super().setup(cfg, data)


TestKVCacheStateMachineHybridUnderPressure = KVCacheMachineHybridUnderPressure.TestCase


class KVCacheMachineHybridShedding(KVCacheMachine):
    """``hybrid`` on pools roomy enough that running requests retain blocks
    for kept points behind their windows before the pool runs out, so that
    steps shed them (``policy.shedding``; ``_check_shedding``)."""

    @initialize(cfg=configs(pressure=True, policy="hybrid", roomier=True), data=st.data())
    def setup(self, cfg: Config, data: st.DataObject) -> None:
        super().setup(cfg, data)


TestKVCacheStateMachineHybridShedding = KVCacheMachineHybridShedding.TestCase
