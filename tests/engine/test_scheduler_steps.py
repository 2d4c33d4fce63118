"""Scheduler steps without a model: worked examples of admission, deferral and preemption.

The scheduler runs over a bookkeeping-only ``KVCacheManager`` (block size 4); a step
is ``schedule()`` then ``update()`` with token 7 sampled for every request that
samples. Steps are written ``(request, start, num_tokens)``.
"""

from __future__ import annotations

from factories import full, mamba, manager, toks

from hybridkv import KVCacheManager
from hybridkv.engine.engine_request import EngineRequest, RequestStatus
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.scheduler import Scheduler, SchedulerOutput

Step = list[tuple[str, int, int]]


def _request(rid: str, tokens: list[int]) -> EngineRequest:
    return EngineRequest(rid, tokens, SamplingParams(max_tokens=8))


def _step(sched: Scheduler) -> tuple[Step, SchedulerOutput]:
    out = sched.schedule()
    sampled = {s.request.request_id: 7 for s in out.scheduled if s.samples}
    sched.update(out, sampled, now=0.0)
    return [(s.request.request_id, s.start, s.num_tokens) for s in out.scheduled], out


def _scheduler(kv: KVCacheManager, budget: int, defer: bool = False) -> Scheduler:
    return Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=budget, defer_pending_hits=defer)


def test_a_hit_on_a_checkpoint_filled_by_a_chunk_starting_mid_block_waits() -> None:
    # Full attention + Mamba, budget 7 (not a multiple of 4). A's second chunk,
    # tokens 7-9, starts inside block 1 (tokens 4-7) and writes the Mamba
    # checkpoint at 8 there. B repeats A's first 8 tokens: its hit of 8 needs that
    # checkpoint, so B waits one step instead of reading a state not yet written.
    kv = manager(40, full(4), mamba(4))
    sched = _scheduler(kv, budget=7, defer=True)
    sched.add_request(_request("a", toks(10)))
    assert _step(sched)[0] == [("a", 0, 7)]
    b = _request("b", [*toks(8), 900])
    sched.add_request(b)
    assert _step(sched)[0] == [("a", 7, 3)]  # 4 tokens of budget left, but B waits
    assert b.status is RequestStatus.WAITING
    assert _step(sched)[0] == [("a", 10, 1), ("b", 8, 1)]  # the hit of 8, adopted now
    assert b.num_cached_tokens == 8
    kv.check_integrity()


def test_nothing_is_admitted_in_a_step_that_preempted() -> None:
    # 5 usable blocks, prefix caching off, budget 8. A (8 tokens) and B (7) hold all
    # 5 blocks after step 3; C (3 tokens) waits for a block. At step 4 B's token 8
    # needs a third block: B, the most recently admitted, preempts itself and frees
    # its 2 blocks. With 7 tokens of budget left B could be re-admitted at once
    # (7 tokens fit in those 2 blocks), but a step that preempted admits nobody.
    kv = manager(6, full(4), enable_caching=False)
    sched = _scheduler(kv, budget=8)
    sched.add_request(_request("a", toks(8)))
    sched.add_request(b := _request("b", toks(7, 200)))
    sched.add_request(_request("c", toks(3, 300)))
    assert _step(sched)[0] == [("a", 0, 8)]
    assert _step(sched)[0] == [("a", 8, 1), ("b", 0, 7)]
    assert _step(sched)[0] == [("a", 9, 1), ("b", 7, 1)]
    assert kv.block_pool.num_free_blocks == 0
    steps, out = _step(sched)
    assert out.preempted == ("b",) and steps == [("a", 10, 1)]
    assert b.status is RequestStatus.PREEMPTED
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    assert _step(sched)[0] == [("a", 11, 1), ("b", 0, 7)]
    kv.check_integrity()
