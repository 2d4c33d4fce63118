"""Replay a request trace through the engine's real scheduler and KV cache manager.

The step loop is ``LLM.step`` with the model runner replaced by the cost
model and the wall clock by a virtual one::

    admit the requests that have arrived by `now`      (scheduler.add_request)
    out = scheduler.schedule()
    now += cost_model.step(out's chunks).seconds
    sampled = {request: next output id} for every chunk that samples
    scheduler.update(out, sampled, now)

When nothing is waiting or running, the clock jumps to the next arrival.
Output token ids count up from ``OUTPUT_TOKEN_BASE`` (2**31), distinct for
every request, so outputs never hit the prefix cache (as with real sampling,
a later prompt only shares what the trace says it shares).

Requests become ``EngineRequest``s (with their token lists) only when they
join the waiting queue, and the queue is kept just long enough to decide a
step: a step admits at most ``max_num_seqs`` waiting requests, in order, so
with more than that many waiting, later arrivals cannot change it. This keeps
memory bounded when the trace outruns the modeled device; the schedule is the
same as with every arrived request queued. Finished requests are dropped
after their figures are taken.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence

from hybridkv.cache_manager.kv_cache_manager import KVCacheManager
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.scheduler import SchedulerOutput
from hybridkv.layouts import ModelLayout
from hybridkv.offload.tier_ranking import tier_weight
from hybridkv.planning import KVCachePlan, plan_kv_cache
from hybridkv.policy.options import for_host_tier
from hybridkv.sim.census import (
    blocks_in_use_by_kind,
    cached_blocks_by_kind,
    empty_by_kind,
    retained_blocks,
)
from hybridkv.sim.collector import collector_paused
from hybridkv.sim.cost_model import CostModel
from hybridkv.sim.options import SimOptions
from hybridkv.sim.percentile import percentiles
from hybridkv.sim.progress import ProgressLine
from hybridkv.sim.result import SimResult, TierFigures
from hybridkv.sim.tier_eviction import TakeLog, TakenBatch
from hybridkv.sim.tier_model import TieredCache
from hybridkv.sim.tier_replay import TierReplay
from hybridkv.sim.tier_swap import scheduler_for, swap_of
from hybridkv.sim.trace import OUTPUT_TOKEN_BASE, TraceRequest
from hybridkv.specs import MambaSpec

#: A new in-use peak is broken down by kind when it exceeds the last one by
#: this share of the pool (so the walk runs a bounded number of times).
PEAK_SAMPLE_FRACTION = 0.01


def replay_max_model_len(
    layout: ModelLayout, requests: Sequence[TraceRequest], given: int | None
) -> int:
    """``given``, or the longest request (prompt + output); checked against the layout.

    Without ``given``, a request longer than the layout's ``max_model_len``
    is a ``ValueError`` naming its line and the fix; with it, any request
    longer than ``given`` is.
    """
    longest = max(requests, key=lambda r: r.num_tokens)
    limit = layout.max_model_len if given is None else given
    if longest.num_tokens > limit:
        whose = f"{layout.name}'s max_model_len" if given is None else "--max-model-len"
        raise ValueError(
            f"trace line {longest.line}: the request needs {longest.num_tokens:,} tokens "
            f"(prompt + output), more than {whose} {limit:,}; pass a larger --max-model-len "
            "or replay fewer requests (--requests)"
        )
    return given if given is not None else longest.num_tokens


def plan_replay(layout: ModelLayout, options: SimOptions, max_model_len: int) -> KVCachePlan:
    """The KV plan of the replay; a budget too small names the minimum."""
    try:
        return plan_kv_cache(
            layout,
            options.memory_bytes,
            block_size=options.block_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=options.max_num_batched_tokens,
        )
    except ValueError as e:
        raise ValueError(f"memory: {e}") from None


class _Live:
    """What the replay remembers of a request in the engine."""

    __slots__ = ("arrival", "out_base")

    def __init__(self, arrival: float, out_base: int) -> None:
        self.arrival = arrival
        self.out_base = out_base


def replay_trace(
    layout: ModelLayout,
    requests: Sequence[TraceRequest],
    options: SimOptions,
    cost: CostModel,
    *,
    progress: bool = False,
    desc: str = "replay",
    on_finished: Callable[[KVCacheManager, int], None] | None = None,
    manager_factory: Callable[..., KVCacheManager] | None = None,
) -> SimResult:
    """Replay ``requests`` (arrivals non-decreasing) and measure (module docstring).

    ``on_finished(manager, n)``: called after each step that finished ``n`` requests,
    their blocks freed (a benchmark samples the cache there); it must only read.
    ``manager_factory``: builds the manager, with ``KVCacheManager``'s arguments
    (None: ``KVCacheManager``; a research script's subclass, e.g.
    ``research/oracle_sim.py``'s)."""
    wall = time.perf_counter()
    max_model_len = replay_max_model_len(layout, requests, options.max_model_len)
    plan = plan_replay(layout, options, max_model_len)
    config = plan.kv_cache_config
    tiered = options.host_memory_bytes is not None
    write_through = options.policy == "lru"
    taken: list[TakenBatch] = []
    hybrid = options.hybrid
    if tiered and not write_through:  # hybrid demotes what the pool evicts
        assert options.host_memory_bytes is not None
        hybrid = for_host_tier(hybrid, options.memory_bytes, options.host_memory_bytes)
    manager = (manager_factory or KVCacheManager)(
        config,
        max_model_len,
        enable_caching=True,
        hash_algo=options.hash_algo,
        cache_policy=options.policy,
        hybrid=hybrid,
        enable_kv_cache_events=tiered and write_through,
    )
    policy = manager.coordinator.policy
    if tiered and not policy.writes_through:  # the engine's hook and decision
        manager.block_pool.on_take = TakeLog(taken, policy.demotion_value)
    tiers: TierReplay | None = None
    if options.host_memory_bytes is not None:
        cache = TieredCache(
            config,
            manager.coordinator.managers,
            manager.block_pool.cached,
            plan.page_bytes,
            cost.device,
            options.host_memory_bytes,
            options.disk_bytes,
            write_through,
            tier_weight(manager),
        )
        tiers = TierReplay(
            cache, taken, cost.device.step_overhead_s, manager.coordinator.get_blocks
        )
    has_mamba = any(isinstance(g.kv_cache_spec, MambaSpec) for g in config.kv_cache_groups)
    swap = swap_of(tiers, options, cost, policy)
    scheduler = scheduler_for(
        manager,
        swap,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        defer_pending_hits=has_mamba,
    )
    closed = options.arrivals == "closed"
    horizon = options.max_num_seqs + 1  # waiting requests that decide a step
    pool = manager.block_pool
    usable = config.num_blocks - 1
    peak_step = max(1, int(usable * PEAK_SAMPLE_FRACTION))
    peak, peak_sampled, peak_by_kind = 0, -peak_step, empty_by_kind(config)

    live: dict[str, _Live] = {}
    ttfts = array("d")
    in_use_steps = array("l")  # blocks live requests hold, after each step's allocation
    running_sum = retained_sum = 0  # running requests / retained blocks, summed over steps
    keeps_points = manager.coordinator.policy.keeps_points
    hit_tokens = full_match = prefill = decode = steps = 0
    next_out = OUTPUT_TOKEN_BASE
    last_finish = 0.0
    first_arrival = 0.0 if closed else requests[0].arrival_s
    now = first_arrival
    k, n_req = 0, len(requests)
    waiting, running = scheduler.waiting, scheduler.running
    bar = ProgressLine(n_req, desc) if progress else None
    with collector_paused() as collector:
        try:
            while k < n_req or waiting or running:
                while k < n_req and len(waiting) < horizon:
                    tr = requests[k]
                    arrival = 0.0 if closed else tr.arrival_s
                    if arrival > now:
                        if not waiting and not running:
                            now = arrival  # idle: jump to the next arrival
                        else:
                            break
                    rid = str(k)
                    params = SamplingParams(max_tokens=tr.output_length, ignore_eos=True)
                    ids = tr.prompt_token_ids()
                    req = EngineRequest(rid, ids, params, max_model_len=max_model_len)
                    scheduler.add_request(req)
                    if tiers is not None:
                        tiers.add(rid)
                    live[rid] = _Live(arrival, next_out)
                    next_out += tr.output_length
                    k += 1
                out = scheduler.schedule()
                if not out.scheduled:
                    if out.preempted:
                        continue
                    raise RuntimeError(
                        f"no request can be scheduled ({len(waiting)} waiting, none running) with "
                        f"{config.num_blocks} blocks: the plan should hold one request"
                    )
                if tiers is not None:
                    tiers.after_schedule(out, manager.take_events())
                in_use = usable - pool.num_free_blocks
                in_use_steps.append(in_use)
                running_sum += len(running)
                if keeps_points:
                    retained_sum += retained_blocks(manager)
                if in_use > peak:
                    peak = in_use
                    if in_use >= peak_sampled + peak_step:
                        peak_sampled = in_use
                        peak_by_kind = blocks_in_use_by_kind(
                            manager, (r.request_id for r in running)
                        )
                chunks = []
                sampled: dict[str, int] = {}
                for s in out.scheduled:
                    req = s.request
                    start, end = s.start, s.start + s.num_tokens
                    chunks.append((start, end))
                    if end == req.num_tokens:
                        rid = req.request_id
                        sampled[rid] = live[rid].out_base + req.num_output_tokens
                        if s.num_tokens == 1 and start >= req.core.num_prompt_tokens:
                            decode += 1
                            continue
                    prefill += s.num_tokens
                if tiers is None:
                    now += cost.step(chunks).seconds
                else:
                    now += tiers.step_seconds(*_tier_step(tiers, out, chunks, cost))
                steps += 1
                finished = scheduler.update(out, sampled, now)
                for req in finished:
                    rec = live.pop(req.request_id)
                    first = req.metrics.first_token_time
                    assert first is not None and req.num_cached_tokens is not None
                    assert req.num_full_match_tokens is not None
                    ttfts.append(first - rec.arrival)
                    hit_tokens += req.num_cached_tokens
                    full_match += req.num_full_match_tokens
                    last_finish = now
                if finished:
                    collector.tick(len(finished))
                    if on_finished is not None:
                        on_finished(manager, len(finished))
                    if bar is not None:
                        bar.update(len(finished))
        finally:
            if bar is not None:
                bar.close()
    p50, p99 = percentiles(ttfts, (50, 99))
    (in_use_p50,) = percentiles(in_use_steps, (50,)) if in_use_steps else (0.0,)
    in_use_mean = sum(in_use_steps) / len(in_use_steps) if in_use_steps else 0.0
    return SimResult(
        layout=layout.name,
        policy=options.policy,
        return_bonus=options.return_bonus,
        return_grade=options.return_grade,
        value_weight=options.value_weight,
        floor_tokens=options.floor_tokens,
        tuning=options.tuning,
        host_memory_bytes=options.host_memory_bytes,
        tiers=TierFigures.of(tiers, swap, options.preemption_mode) if tiers is not None else None,
        memory_bytes=options.memory_bytes,
        device=cost.device.name,
        arrivals=options.arrivals,
        num_requests=n_req,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        max_model_len=max_model_len,
        num_blocks=config.num_blocks,
        page_bytes=plan.page_bytes,
        prompt_tokens=sum(r.input_length for r in requests),
        output_tokens=sum(r.output_length for r in requests),
        hit_tokens=hit_tokens,
        full_match_tokens=full_match,
        prefill_tokens=prefill - (tiers.loaded_tokens if tiers is not None else 0),
        decode_tokens=decode,
        preemptions=scheduler.num_preemptions,
        steps=steps,
        cached_blocks=cached_blocks_by_kind(manager),
        peak_blocks_in_use=peak,
        peak_blocks_by_kind=peak_by_kind,
        in_use_mean=in_use_mean / usable,
        in_use_p50=in_use_p50 / usable,
        running_mean=running_sum / steps if steps else 0.0,
        retained_mean=retained_sum / steps / usable if steps else 0.0,
        ttft_p50_s=p50,
        ttft_p99_s=p99,
        makespan_s=last_finish - first_arrival,
        replay_seconds=time.perf_counter() - wall,
    )


def _tier_step(
    tiers: TierReplay, out: SchedulerOutput, chunks: list[tuple[int, int]], cost: CostModel
) -> tuple[float, float]:
    """A step's compute seconds without its loaded tokens, and its load seconds."""
    ids = [s.request.request_id for s in out.scheduled]
    scheduled = [(rid, a, b) for rid, (a, b) in zip(ids, chunks, strict=True)]
    computed, load_s = tiers.clip(scheduled)
    return cost.step(computed).seconds, load_s
