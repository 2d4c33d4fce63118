"""Stateful property test of ``TieredCache`` under a real ``KVCacheManager``.

A toy scheduler drives a planned hybrid layout (sliding window, Mamba or
chunked, each with full attention; CPU buffers) under either policy, with a
host tier and maybe a disk tier whose copies land only when the machine says
or when someone waits (``LazyCopier``). Requests share prefixes of a few
documents; they are admitted through ``prepare`` (their loads may stay in
flight), decode, finish, or are aborted while loading; the pool reuses free
blocks (demoting them); a disk entry gets a flipped byte; the engine
restarts, as the same model or as another. Every block the toy computes gets
bytes that are a function of the model, the group and the block hash, so a
stale, half-copied or foreign unit shows. Checked after every step:

- ``check_integrity`` of the manager (held blocks counted as holders) and of
  the tiers (bytes accounted, budgets kept, pins = ``pin`` calls + transfers
  in flight: nothing pinned or in flight was evicted);
- no hit without every unit it needs: an admitted hit's needed blocks are on
  the device in every group, each with its bytes; and the hit is the longest
  the device and the tiers held when it was staged (shorter only when a load
  failed or there was no room to load);
- no block evicted, reused or freed while a load holds it: a held block is
  in use and in no running request's table, and every cached block of the
  device holds its bytes (a held block handed out, or a demotion copied after
  its block was rewritten, would not);
- every entry of a tier is a unit this model computed;
- a restart serves only entries whose checksum and fingerprint match: the
  disk then holds exactly its own model's entries from before (less those
  with a flipped header), and a flipped payload is never a hit.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import torch
from hypothesis import event
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from lazy_copier import LazyCopier

from hybridkv import KVCacheManager, Request
from hybridkv.coordinators.tiered_hit import tiered_hit_length
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.offload.tier_ranking import tier_rules
from hybridkv.planning import allocate_kv_cache, plan_kv_cache
from hybridkv.tiers import DiskTier, HostTier, ModelFingerprint, UnitKey
from hybridkv.tiers.disk_dir import entry_name
from hybridkv.tiers.torch_memory import TorchHostMemory

MAX_LEN = 64
LAYOUTS = {"tiny-gemma3": 90_000, "tiny-jamba": 200_000, "tiny-llama4": 90_000}  # bytes
DOCS = [list(range(1000 * d + 3, 1000 * d + 3 + MAX_LEN)) for d in range(2)]
MODELS = ("weights-a", "weights-b")
DOC = st.sampled_from([0, 0, 1])  # the first document is shared more often
SHARED = st.one_of(st.sampled_from([16, 32, 48, 56]), st.integers(1, MAX_LEN - 8))


class TieredCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
        self.waiting: list[Request] = []
        self.staged: dict[str, int] = {}  # request id -> the tiered hit when staged
        self.running: list[Request] = []
        self.made = 0
        self.on_disk: dict[str, set[UnitKey]] = {}  # model -> its disk entries at close
        self.flipped: dict[str, set[UnitKey]] = {m: set() for m in MODELS}  # not yet found
        self.computed: dict[str, set[UnitKey]] = {m: set() for m in MODELS}  # units written
        self.tiers: TieredCache | None = None

    @initialize(
        layout=st.sampled_from(sorted(LAYOUTS)),
        policy=st.sampled_from(["lru", "hybrid"]),
        host_units=st.sampled_from([1, 6, 40]),
        disk_units=st.sampled_from([None, 3, 60]),
        warm=st.booleans(),
    )
    def setup(
        self, layout: str, policy: str, host_units: int, disk_units: int | None, warm: bool
    ) -> None:
        """The engine; ``warm``: a document served and demoted first (tiers in use from
        the first step)."""
        self.layout, self.policy = layout, policy
        plan = plan_kv_cache(
            shipped_layout(layout),
            LAYOUTS[layout],
            max_model_len=MAX_LEN,
            max_num_batched_tokens=MAX_LEN,
        )
        self.config = plan.kv_cache_config
        unit = max(BlockBytes(self.config, allocate_kv_cache(self.config)).unit_bytes)
        self.host_budget = host_units * unit
        self.disk_budget = None if disk_units is None else disk_units * (unit + 512)
        self._open(MODELS[0])
        if warm:
            self.serve(0, MAX_LEN - 8, 0, reuse=True)

    # -- the engine ----------------------------------------------------------
    def _open(self, model: str) -> None:
        self.model = model
        kw: dict[str, Any] = {"hybrid_tail_tokens": 16} if self.policy == "hybrid" else {}
        self.kv = KVCacheManager(self.config, MAX_LEN, cache_policy=self.policy, **kw)
        self.buffers = allocate_kv_cache(self.config)
        fp = ModelFingerprint.from_kv_cache_config(self.config, model)
        host_rule, disk_rule = tier_rules(self.kv) or (None, None)
        self.host_copier, self.disk_copier = LazyCopier(), LazyCopier()
        host = HostTier(fp, self.host_budget, TorchHostMemory("cpu"), host_rule, self.host_copier)
        disk = None
        if self.disk_budget is not None:
            disk = DiskTier(fp, self.root, self.disk_budget, self.disk_copier, disk_rule)
        self.tiers = TieredCache(self.kv, BlockBytes(self.config, self.buffers), host, disk)
        self.managers = self.kv.coordinator.managers
        self.garbage = 0

    def _content(self, gid: int, block_hash: bytes) -> bytes:
        """The bytes this model's unit of ``(gid, block_hash)`` holds."""
        assert self.tiers is not None
        n = self.tiers.block_bytes.unit_bytes[gid]
        seed = hashlib.sha256(f"{self.model}|{gid}|".encode() + block_hash).digest()
        return (seed * (n // len(seed) + 1))[:n]

    def _write(self, gid: int, block_id: int, data: bytes | None) -> None:
        """Fill a block's unit: ``data``, or garbage (a computation of other tokens)."""
        assert self.tiers is not None
        parts = self.tiers.block_bytes.parts(gid, block_id)
        off = 0
        for p in parts:
            if data is None:
                self.garbage = self.garbage % 250 + 1
                p.fill_(self.garbage)
            else:
                p.copy_(torch.frombuffer(bytearray(data[off : off + p.numel()]), dtype=torch.uint8))
            off += p.numel()

    def _read(self, gid: int, block_id: int) -> bytes:
        assert self.tiers is not None
        return b"".join(bytes(p.numpy()) for p in self.tiers.block_bytes.parts(gid, block_id))

    def _compute(self, r: Request) -> None:
        """The step wrote its blocks: cached ones get their unit's bytes, others garbage."""
        for gid, table in enumerate(self.kv.get_blocks(r.request_id).blocks):
            for b in table:
                if not b.is_null and b.block_hash is not None:
                    self._write(gid, b.block_id, self._content(gid, b.block_hash))
                    self.computed[self.model].add(UnitKey(b.block_hash, gid))

    def _tiered_hit(self, r: Request) -> int:
        """The longest hit the device and the tiers hold for ``r`` (the reference)."""
        assert self.tiers is not None
        pool, host, disk = self.kv.block_pool, self.tiers.host, self.tiers.disk

        def present(gid: int, _i: int, h: bytes) -> bool:
            key = UnitKey(h, gid)
            return h in pool.cached[gid] or host.contains(key) or bool(disk and disk.contains(key))

        r.bind_hasher(self.kv.hasher)
        return tiered_hit_length(self.managers, r.live_block_hashes, r.num_tokens - 1, present)

    # -- requests ------------------------------------------------------------
    def _new(self, doc: int, shared: int, extra: int) -> Request:
        """A request sharing a document's first ``shared`` tokens, then its own."""
        self.made += 1
        tokens = [*DOCS[doc][:shared], *range(7 * self.made, 7 * self.made + extra)]
        r = Request(f"r{self.made}", tokens)
        self.waiting.append(r)
        return r

    @rule(doc=DOC, shared=SHARED, extra=st.integers(0, 4), admit=st.booleans(), wait=st.booleans())
    def arrive(self, doc: int, shared: int, extra: int, admit: bool, wait: bool) -> None:
        """A request queues (and is ``admit``-ted now, when it can)."""
        r = self._new(doc, shared, extra)
        if admit:
            self._admit(r, wait)

    @rule(doc=DOC, shared=SHARED, extra=st.integers(0, 4), reuse=st.booleans())
    def serve(self, doc: int, shared: int, extra: int, reuse: bool) -> None:
        """A whole request: admitted (waiting for its loads), computed and finished;
        then, with ``reuse``, the pool reuses every free block (demoting them)."""
        r = self._new(doc, shared, extra)
        self._admit(r, wait=True)
        if r in self.running:
            self._finish(r)
        if reuse:
            self.pool_reuses_blocks(1 << 20)

    @rule(data=st.data(), wait=st.booleans())
    def admit(self, data: st.DataObject, wait: bool) -> None:
        if self.waiting:
            self._admit(data.draw(st.sampled_from(self.waiting)), wait)

    def _admit(self, r: Request, wait: bool) -> None:
        """The scheduler's admission: ``prepare`` (False: loads in flight, it waits),
        then the prefix lookup and the allocation, with nothing in between."""
        assert self.tiers is not None
        stats = self.tiers.stats
        failed = (stats.load_failures, stats.skipped_no_room)
        before = (stats.hit_tokens, stats.disk_hit_tokens)
        if r.request_id not in self.staged:
            self.staged[r.request_id] = self._tiered_hit(r)
        if not self.tiers.prepare(r, wait):
            event("loads in flight")
            return
        want = self.staged.pop(r.request_id)  # what device and tiers held when staged
        blocks, hit = self.kv.get_computed_blocks(r)
        assert hit <= self._tiered_hit(r)  # (others may have cached more meanwhile)
        assert hit >= want or (stats.load_failures, stats.skipped_no_room) != failed
        if stats.hit_tokens > before[0]:
            event("a tier hit" + (" from disk" if stats.disk_hit_tokens > before[1] else ""))
        if stats.load_failures > failed[0]:
            event("a load failed")
        for gid, m in enumerate(self.managers):  # every unit the hit needs, with its bytes
            table = blocks.blocks[gid]
            for i in range(m.first_needed_block(hit), hit // m.block_size):
                b = table[i]
                assert not b.is_null and b.block_hash is not None, (gid, i, hit)
                assert self._read(gid, b.block_id) == self._content(gid, b.block_hash), (gid, i)
        if self.kv.allocate_slots(r, r.num_tokens - hit, hit, blocks) is None:
            return  # no room: it waits (its loaded blocks stay cached)
        self.waiting.remove(r)
        r.num_computed_tokens = r.num_tokens
        self._compute(r)
        self.running.append(r)

    @rule(data=st.data(), finish=st.booleans())
    def decode_or_finish(self, data: st.DataObject, finish: bool) -> None:
        """A running request decodes a token (freed when out of room) or finishes."""
        if not self.running:
            return
        r = data.draw(st.sampled_from(self.running))
        if finish or r.num_tokens >= MAX_LEN:
            self._finish(r)
            return
        r.append_output_token_ids(5)
        if self.kv.allocate_slots(r, 1) is None:
            self._finish(r)  # preempted: it would be recomputed from scratch
            return
        r.num_computed_tokens += 1
        self._compute(r)

    def _finish(self, r: Request) -> None:
        self.running.remove(r)
        self.kv.free(r)

    @rule(data=st.data())
    def abort_while_loading(self, data: st.DataObject) -> None:
        assert self.tiers is not None
        if not self.staged:
            return
        rid = data.draw(st.sampled_from(sorted(self.staged)))
        r = next(w for w in self.waiting if w.request_id == rid)
        self.tiers.release(r)  # lands its loads, lets go of its blocks
        del self.staged[rid]
        self.waiting.remove(r)
        event("aborted while loading")

    # -- the pool and the copies ---------------------------------------------
    @rule(n=st.sampled_from([1, 8, 1 << 20]))
    def pool_reuses_blocks(self, n: int) -> None:
        """Other work takes free blocks (demoting the cached ones) and overwrites them."""
        pool = self.kv.block_pool
        blocks = pool.get_new_blocks(min(n, pool.num_free_blocks))
        for b in blocks:
            for gid in range(len(self.managers)):
                self._write(gid, b.block_id, None)
        pool.free_blocks(blocks)

    @rule(host=st.integers(0, 3), disk=st.integers(0, 3))
    def copies_land(self, host: int, disk: int) -> None:
        self.host_copier.land(host)
        self.disk_copier.land(disk)

    @rule(data=st.data(), offset=st.integers(-40, 120))
    def flip_a_disk_byte(self, data: st.DataObject, offset: int) -> None:
        """A byte of a disk entry flips: in its header (from the start) or payload."""
        assert self.tiers is not None
        disk = self.tiers.disk
        keys = [] if disk is None else sorted(set(disk.keys()) - self.flipped[self.model])
        if disk is None or not keys:
            return
        key = data.draw(st.sampled_from(keys))
        path = disk.folder / entry_name(key)
        raw = bytearray(path.read_bytes())
        raw[offset % len(raw) if offset >= 0 else max(offset, -len(raw))] ^= 0x10
        path.write_bytes(bytes(raw))
        self.flipped[self.model].add(key)

    @rule(other_model=st.booleans(), now=st.integers(0, 3))
    def restart(self, other_model: bool, now: int) -> None:
        """Close the engine (its cache persisted to disk) and start it again, as the same
        model or as the other one, over the same disk folder (one draw in four: a
        restart ends every request, so it is rarer than the other rules)."""
        assert self.tiers is not None
        if now:
            return
        for rid in list(self.staged):
            self.tiers.release(next(w for w in self.waiting if w.request_id == rid))
        for r in list(self.running):
            self._finish(r)
        self.waiting, self.staged = [], {}
        self.tiers.close()  # persists, lands and settles every copy
        if self.tiers.disk is not None:
            self.on_disk[self.model] = set(self.tiers.disk.keys())
        model = MODELS[(MODELS.index(self.model) + other_model) % 2]
        self._open(model)
        if self.tiers.disk is not None:
            held, was = set(self.tiers.disk.keys()), self.on_disk.get(model, set())
            assert held <= was, "a restart adopted entries its model never stored"
            assert was - self.flipped[model] <= held, "a restart lost intact entries"
            self.flipped[model] &= held  # a flipped header is found now, a payload at load
            event("restarted with disk entries" if held else "restarted, the disk empty")

    # -- invariants ----------------------------------------------------------
    @invariant()
    def integrity(self) -> None:
        if self.tiers is None:
            return
        self.kv.check_integrity()
        self.tiers.check_integrity()
        host, disk = self.tiers.host, self.tiers.disk
        assert host.used_bytes <= host.budget_bytes
        assert disk is None or disk.used_bytes <= disk.budget_bytes
        held = {b.block_id for b in self.tiers.loads.held() if b.block_hash is None}
        for r in self.running:  # a block being loaded into belongs to no one else
            for table in self.kv.get_blocks(r.request_id).blocks:
                assert not held & {b.block_id for b in table if not b.is_null}
        for gid, index in enumerate(self.kv.block_pool.cached):
            for h, b in index.items():
                assert self._read(gid, b.block_id) == self._content(gid, h), (gid, b)
        computed = self.computed[self.model]
        assert set(host.keys()) <= computed
        assert disk is None or set(disk.keys()) <= computed

    def teardown(self) -> None:
        if self.tiers is not None:
            self.tiers.close()
        shutil.rmtree(self.root, ignore_errors=True)


TestTieredCache = TieredCacheMachine.TestCase
