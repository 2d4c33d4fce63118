"""Token-budget scheduling with chunked prefill, prefix hits and preemption.

Each ``schedule()`` builds one step of at most ``max_num_batched_tokens``
tokens over at most ``max_num_seqs`` running requests (vLLM v1's policy):

1. Running requests first, in admission order: each gets
   ``min(remaining, budget)`` tokens (a decode is one token, a long prompt is
   prefilled in chunks across steps). When ``allocate_slots`` returns None the
   most recently admitted running request is preempted (its blocks freed, its
   computed count reset, back at the head of the waiting queue) until the
   allocation fits or the request preempts itself.
2. Then waiting requests, oldest first, while budget and seats remain: the
   prefix-cache hit is looked up (``get_computed_blocks``), the rest is
   scheduled like a running request. A request that does not fit waits
   (nothing partial is kept). Nothing new is admitted in a step that preempted.

Blocks are cached when they are allocated, before the step computes them. An
attention layer writes every token's K/V before any sequence attends, so a
request may hit blocks another one fills in the same step. A Mamba state is
not: with ``defer_pending_hits`` (set for models with Mamba groups) a request
whose hit includes a block being computed in this step waits one step, and
then adopts the finished checkpoint.

With ``tiers`` (a ``TieredCache``), a waiting request's hit in the host or
disk tier is first loaded onto the device (``tiers.prepare``), if loading is
estimated cheaper than recomputing it (``offload/load_cost.py``). The request
is looked up only once its loads have landed (on CUDA: once they are queued on
the copy stream, which the step's stream waits on). Until then it holds no
token budget and no seat: it keeps its place in the queue and the requests
behind it are admitted past it (as vLLM does for requests waiting on remote
KV); only when nothing else can run does the step wait for the loads of the
first such request (wherever it is in the queue: its held blocks may be what
the requests ahead of it lack), and that wait is the step's ``load_wait`` (and
``OffloadStats.load_wait_seconds``).
A preempted request may be swapped out once freed (``tiers.swap_out``:
``preemption_mode``, or the swap rule, ``offload/swap_decision.py``): units its
resume needs go to the host tier and its resume loads them back like any tier
hit. After each step the tiers see what
was computed (``tiers.after_step``: a write-through policy stores it, and the
step's time per token feeds the cost model; with async scheduling when the next
step is scheduled, ``commit_computed``).

A request resumed after preemption recomputes its prompt and outputs so far
(the prefix cache usually gives most of it back) and continues exactly where
it stopped. ``update`` applies a step's results: computed counts advance and
sampled tokens are appended; finished requests release their blocks.

Async scheduling (``LLM(async_scheduling=True)``, ``hybridkv.engine.async_step``):
the next step is scheduled while one is in flight. ``commit_computed`` counts the
step in flight as computed first; a running request's token sampled by it is
pending (``EngineRequest.num_pending_tokens``): its position is scheduled already
(its id comes from the device), unless appending it ends the request by
``max_tokens`` / ``max_model_len`` (known on the host). The manager caches only
blocks whose tokens are known (``min(computed after, num_tokens)``), so a block
ending in a pending token is cached one step later. A request preempted while its
step is in flight gets that step's token when it lands (``update``: appended while
it waits, as a synchronous step would have appended it before the preemption); a
request that stopped at the step in flight has its next step's token dropped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.engine.engine_request import EngineRequest, RequestStatus

if TYPE_CHECKING:
    from hybridkv.offload import TieredCache


class ScheduledRequest(NamedTuple):
    """One request's share of a step: tokens ``[start, start + num_tokens)``.

    A named tuple (a step makes one per running request: a third of a frozen
    dataclass's cost to build)."""

    request: EngineRequest
    start: int
    num_tokens: int
    #: The step reaches the request's last token known when it was scheduled: it samples.
    samples: bool
    #: Admitted in this step: tokens before ``start`` are its prefix hit.
    admitted: bool = False


@dataclass(frozen=True)
class SchedulerOutput:
    """A step: the scheduled requests in batch order (the running ones, then those
    admitted in this step), who was preempted, and the seconds scheduling blocked on
    tier loads (``load_wait``)."""

    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[str, ...]
    load_wait: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    """Waiting and running queues over one ``KVCacheManager`` (module docstring)."""

    def __init__(
        self,
        manager: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        defer_pending_hits: bool = False,
        tiers: TieredCache | None = None,
        preemption_mode: str | None = None,
    ) -> None:
        self.manager = manager
        self.tiers = tiers
        self.preemption_mode = preemption_mode  # ``SchedulerConfig``'s: for ``tiers.swap_out``
        self.defer_pending_hits = defer_pending_hits
        self._block_sizes = [
            g.kv_cache_spec.block_size for g in manager.kv_cache_config.kv_cache_groups
        ]
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.num_preemptions = 0
        self._scheduled_at = 0.0  # perf_counter at the end of the last schedule()

    def add_request(self, request: EngineRequest) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        waited = 0.0
        if self.tiers is not None:
            self.tiers.poll()
            waited = self.tiers.stats.load_wait_seconds
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        i = 0
        running, allocate = self.running, self.manager.allocate_slots  # bound: once a request
        while i < len(running) and budget > 0:
            req = running[i]
            core = req.core
            # A token sampled by the step in flight counts as known (async scheduling).
            total, computed = core.num_tokens + req.num_pending_tokens, core.num_computed_tokens
            if req.num_pending_tokens and req.stops_at_pending():
                i += 1  # its step in flight samples its last token: nothing to schedule
                continue
            n = total - computed if total - computed < budget else budget
            while allocate(core, n) is None:
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled.append(ScheduledRequest(req, computed, n, computed + n == total))
                budget -= n
                i += 1
                continue
            break  # the request preempted itself
        if not preempted:
            budget = self._admit(scheduled, budget)
            for _ in range(len(self.waiting)):
                # Nothing could run: a request's staged loads (in flight, or landed and
                # not yet adopted) hold blocks. Land the first one's and admit again.
                staged = self._first_staged() if not scheduled else None
                if staged is None:
                    break
                assert self.tiers is not None
                landed = self.tiers.prepare(staged.core, wait=True)
                assert landed, "prepare(wait=True) returns once the loads have landed"
                # Admit again, waiting on loads while nothing runs: a request whose
                # landing failed is staged anew (a shorter hit) and lands at once.
                budget = self._admit(scheduled, budget, wait=True)
        if self.tiers is not None:
            waited = self.tiers.stats.load_wait_seconds - waited
            self.tiers.start_loads()  # the loads left in flight copy during the step
        self._scheduled_at = time.perf_counter()
        return SchedulerOutput(tuple(scheduled), tuple(preempted), waited)

    def _admit(self, scheduled: list[ScheduledRequest], budget: int, wait: bool = False) -> int:
        """Admit waiting requests in order while budget and seats remain; one whose
        tier loads are in flight is passed over (it keeps its place), unless ``wait``
        and nothing is scheduled yet: then its loads are waited for."""
        pending: set[tuple[int, int]] | None = None  # built on first need, then extended
        k = 0  # waiting[:k]: passed over, their loads in flight
        while k < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[k]
            if self.tiers is not None and not self.tiers.prepare(
                req.core, wait=wait and not scheduled
            ):
                k += 1  # its tier hit is loading: it runs once that has landed
                continue
            if self.manager.cannot_admit(req.core, budget):
                break  # provably no room yet: skip the hit scan (same outcome)
            blocks, hit = self.manager.get_computed_blocks(req.core, record_stats=False)
            if hit and self.defer_pending_hits:
                if pending is None:
                    pending = set()
                    for s in scheduled:
                        self._add_pending(pending, s)
                if any(
                    (g, b.block_id) in pending for g, grp in enumerate(blocks.blocks) for b in grp
                ):
                    break
            n = min(req.num_tokens - hit, budget)
            if self.manager.allocate_slots(req.core, n, hit, blocks) is None:
                break  # looked up again next step: its stats count at its admission
            self.manager.record_prefix_cache_stats(req.core, hit)
            del self.waiting[k]
            if req.num_cached_tokens is None:
                req.num_cached_tokens = hit
                req.num_full_match_tokens = max(blocks.full_hit_tokens, hit)
            req.core.num_computed_tokens = hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(ScheduledRequest(req, hit, n, hit + n == req.num_tokens, True))
            if pending is not None:
                self._add_pending(pending, scheduled[-1])
            budget -= n
        return budget

    def _first_staged(self) -> EngineRequest | None:
        """The first waiting request whose tier loads are staged (they hold blocks
        until it is admitted), or None."""
        if self.tiers is None:
            return None
        return next((r for r in self.waiting if self.tiers.loading(r.core)), None)

    def _add_pending(self, pending: set[tuple[int, int]], s: ScheduledRequest) -> None:
        """Add the ``(group, block)`` pairs that step ``s`` fills (block 0 is null)."""
        ids = self.manager.get_block_ids(s.request.request_id)
        for g, bs in enumerate(self._block_sizes):
            last = -(-(s.start + s.num_tokens) // bs)
            pending.update((g, b) for b in ids[g][s.start // bs : last] if b)

    def _preempt(self, req: EngineRequest) -> None:
        self.manager.free(req.core)  # its blocks carry their release values now
        self._swap_out(req.core)
        req.core.num_computed_tokens = 0
        req.core.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _swap_out(self, request: Request) -> None:
        """The preempted ``request`` is freed, its computed count not yet reset: its
        units go to the host tier if the swap decision says so (``tiers.swap_out``)."""
        if self.tiers is not None:
            self.tiers.swap_out(request, self.preemption_mode)

    def _tiers_after(self, out: SchedulerOutput) -> None:
        """Show the tiers what step ``out`` computes (``TieredCache.after_step``)."""
        if self.tiers is not None:
            prefill = sum(s.num_tokens for s in out.scheduled if not s.samples or s.num_tokens > 1)
            self.tiers.after_step(
                [
                    (s.request.core, 0 if s.admitted else s.start, s.start + s.num_tokens)
                    for s in out.scheduled
                ],
                out.num_tokens,
                prefill,
                time.perf_counter() - self._scheduled_at,
            )

    def update(
        self, out: SchedulerOutput, sampled: dict[str, int], now: float, committed: bool = False
    ) -> list[EngineRequest]:
        """Advance computed counts, append ``sampled`` tokens; return newly finished.
        ``committed``: ``commit_computed(out)`` ran (the tiers have seen the step)."""
        finished = []
        if not committed:
            self._tiers_after(out)
        get, running = sampled.get, RequestStatus.RUNNING
        for req, start, num_tokens, _, _ in out.scheduled:
            if req.status is not running:  # async scheduling: stopped or preempted since
                self._late_token(req, get(req.request_id), now)
                continue
            req.core.num_computed_tokens = start + num_tokens
            token = get(req.request_id)
            if token is None:
                continue
            req.append_token(token, now)
            if req.status.finished:
                finished.append(req)
        for req in finished:
            self.running.remove(req)
            self.manager.free(req.core)
            req.metrics.finished_time = now
        return finished

    def commit_computed(self, out: SchedulerOutput) -> None:
        """Async scheduling: the step ``out`` is in flight; count its tokens as computed
        before the next step is scheduled (``update(committed=True)`` later appends its
        samples). The tiers see it now, before the next schedule frees or reuses its
        blocks (their copies wait for the step: ``hybridkv.offload.inflight_step``)."""
        self._tiers_after(out)
        for req, start, num_tokens, _, _ in out.scheduled:
            if req.status is RequestStatus.RUNNING:
                req.core.num_computed_tokens = start + num_tokens

    def _late_token(self, req: EngineRequest, token: int | None, now: float) -> None:
        """Async scheduling: ``token`` of a step launched before ``req`` finished (it is
        dropped: the wasted slot) or was preempted (appended: its resume recomputes it,
        as if it had been appended before the preemption; a stop leaves the queue)."""
        if token is None or req.status.finished:
            return
        req.append_token(token, now)
        if req.status.finished:
            self.waiting.remove(req)  # preempted, so freed already
            req.metrics.finished_time = now

    def abort(self, request_id: str) -> bool:
        """Drop a waiting or running request and free its blocks, first taking those
        past its computed tokens out of the prefix cache; False if unknown."""
        for queue in (self.running, self.waiting):
            for req in queue:
                if req.request_id == request_id:
                    queue.remove(req)
                    if self.tiers is not None:
                        self.tiers.release(req.core)  # loads in flight: wait, let go
                    # Blocks of a step that never ran (a failed one) leave the cache.
                    self.manager.uncache_uncomputed(req.core)
                    self.manager.free(req.core)
                    req.status = RequestStatus.FINISHED_ABORTED
                    return True
        return False
