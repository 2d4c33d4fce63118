"""``TierReplay``: the tiers' part of one replay's step loop (``--host-memory``).

Each step, after the scheduler decides (``after_schedule``): the tiers take
what the device wrote (``lru``) or evicted (``hybrid``) since the last step,
and each request admitted for the first time gets its tier hit
(``TieredCache.admit``). A request with a tier hit has tokens ``[device hit,
total)`` *loaded*, not computed: the scheduler still walks them through its
token budget like a prefill, but ``step_seconds`` drops them from the cost
model's chunks and charges their share of the load instead::

    step = max(compute of the other tokens, loads of this step) (+ overhead
           when nothing is computed)
    wait = step - compute, where the loads take longer

Loads run on the copy engine beside the compute (one link, the loads of a
step one after the other). ``load_wait_s`` sums the waits: the time the
device waited for loads. Stores to the tiers (write-through, demotion) are
device-to-host copies off the critical path, and cost nothing here. A
preempted request drops the rest of its load; when it resumes, what the tiers
hold past its device hit is loaded back the same way (``reloaded_tokens``,
no hit of its prompt: hits count at first admission). A load that passes
has landed (``TieredCache.landed``): only then do the host's copies of its
units count as hits (under ``hybrid``, moved to spare room).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hybridkv.core.block import KVCacheBlock
from hybridkv.engine.scheduler import SchedulerOutput
from hybridkv.sim.tier_eviction import TakenBatch
from hybridkv.sim.tier_model import TieredCache, TierLoad


class TierReplay:
    """Tier hits and load time over one replay (module docstring)."""

    def __init__(
        self,
        cache: TieredCache,
        taken: list[TakenBatch],
        step_overhead_s: float,
        tables: Callable[[str], Sequence[Sequence[KVCacheBlock]]],
    ) -> None:
        self.cache = cache
        self.tables = tables
        self.taken = taken
        self.step_overhead_s = step_overhead_s
        self.unseen: set[str] = set()  # added requests not admitted yet
        self.loading: dict[str, TierLoad] = {}  # tier hits with tokens not yet passed
        self.host_hit_tokens = self.disk_hit_tokens = 0
        self.host_load_bytes = self.disk_load_bytes = 0
        self.loaded_tokens = 0  # tokens passed by loads, not computed
        self.reloaded_tokens = 0  # tokens a resumed request loads back
        self.preempted: set[str] = set()  # preempted requests not resumed yet
        self.tier_hits = 0
        self.load_wait_s = 0.0
        self.load_s = 0.0

    def add(self, request_id: str) -> None:
        self.unseen.add(request_id)

    def after_schedule(self, out: SchedulerOutput, events: Sequence[object]) -> None:
        """Give each first admission in ``out`` its tier hit, and sync the tiers:
        demotions first (units the device evicted while allocating are in the
        host when the lookup runs, as they were on the device before), writes
        through after (what this step computes is no hit for itself)."""
        cache = self.cache
        if not cache.write_through:
            cache.sync(events, self.taken)  # type: ignore[arg-type]
        self._admit(out)
        if cache.write_through:
            cache.sync(events, self.taken)  # type: ignore[arg-type]

    def _admit(self, out: SchedulerOutput) -> None:
        cache = self.cache
        for rid in out.preempted:
            self.loading.pop(rid, None)
            self.preempted.add(rid)
        for s in out.scheduled:
            req = s.request
            rid = req.request_id
            first = rid in self.unseen and req.num_cached_tokens is not None
            resumed = rid in self.preempted
            if not (first or resumed):
                continue
            self.unseen.discard(rid)
            self.preempted.discard(rid)
            load = cache.admit(
                req.core.live_block_hashes,
                req.num_tokens - 1,
                req.num_cached_tokens if first else s.start,  # type: ignore[arg-type]
                self.tables(rid),
            )
            if load is None:
                continue
            self.host_load_bytes += load.host_bytes
            self.disk_load_bytes += load.disk_bytes
            self.loading[rid] = load
            if resumed:  # reloads what the preemption dropped; no hit of its prompt
                self.reloaded_tokens += load.total - load.device_hit
                continue
            self.tier_hits += 1
            self.host_hit_tokens += load.host_tokens
            self.disk_hit_tokens += load.disk_tokens

    def clip(
        self, scheduled: Sequence[tuple[str, int, int]]
    ) -> tuple[list[tuple[int, int]], float]:
        """``(request, start, end)`` chunks -> the chunks to compute and the seconds
        of loads this step (the loaded share of each chunk)."""
        chunks: list[tuple[int, int]] = []
        load_s = 0.0
        loading = self.loading
        for rid, start, end in scheduled:
            load = loading.get(rid)
            if load is None or start >= load.total:
                chunks.append((start, end))
                continue
            upto = min(end, load.total)
            passed = upto - max(start, load.device_hit)
            self.loaded_tokens += passed
            load_s += load.seconds * passed / (load.total - load.device_hit)
            if upto >= load.total:
                del loading[rid]
                self.cache.landed(load)
            if end > upto:
                chunks.append((upto, end))
        return chunks, load_s

    def step_seconds(self, compute_s: float, load_s: float) -> float:
        """One step's time with its loads (module docstring); the wait is summed."""
        if load_s <= 0:
            return compute_s
        self.load_s += load_s
        if compute_s <= 0:
            compute_s = self.step_overhead_s
            self.load_wait_s += load_s
            return compute_s + load_s
        if load_s > compute_s:
            self.load_wait_s += load_s - compute_s
            return load_s
        return compute_s
