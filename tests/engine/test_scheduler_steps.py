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


def test_without_deferral_a_hit_on_blocks_filled_this_step_is_adopted_at_once() -> None:
    # Attention only (the default, no deferral): K/V of a step is written before any
    # sequence attends, so B may hit the blocks A fills in the same step.
    kv = manager(40, full(4))
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=32)
    sched.add_request(_request("a", toks(9)))
    sched.add_request(_request("b", [*toks(8), 900]))
    assert _step(sched)[0] == [("a", 0, 9), ("b", 8, 1)]
    kv.check_integrity()


def test_a_request_admitted_this_step_makes_its_checkpoints_pending() -> None:
    # Full attention + Mamba, deferral on. In step 2, R hits P's block from step 1
    # (that builds the pending set), then B is admitted without a hit and fills
    # blocks 0-1 of its own prompt; C repeats B's first 8 tokens, so its hit of 8
    # needs B's checkpoint at 8: C waits for step 3.
    kv = manager(40, full(4), mamba(4))
    sched = _scheduler(kv, budget=32, defer=True)
    sched.add_request(_request("p", [*toks(4, 500), 1]))
    assert _step(sched)[0] == [("p", 0, 5)]
    for rid, tokens in (("r", [*toks(4, 500), 2]), ("b", [*toks(8), 900]), ("c", [*toks(8), 901])):
        sched.add_request(_request(rid, tokens))
    assert _step(sched)[0] == [("p", 5, 1), ("r", 4, 1), ("b", 0, 9)]
    assert _step(sched)[0] == [("p", 6, 1), ("r", 5, 1), ("b", 9, 1), ("c", 8, 1)]
    kv.check_integrity()


def test_every_request_gets_a_token_while_the_budget_lasts() -> None:
    # Budget 2: two one-token prompts are both admitted in step 1 (the second with
    # the last token of budget) and both decode in every later step.
    kv = manager(40, full(4))
    sched = _scheduler(kv, budget=2)
    sched.add_request(_request("a", toks(1)))
    sched.add_request(_request("b", toks(1, 200)))
    assert _step(sched)[0] == [("a", 0, 1), ("b", 0, 1)]
    assert _step(sched)[0] == [("a", 1, 1), ("b", 1, 1)]
    assert _step(sched)[0] == [("a", 2, 1), ("b", 2, 1)]


def test_max_num_seqs_caps_the_running_requests() -> None:
    kv = manager(40, full(4))
    sched = Scheduler(kv, max_num_seqs=2, max_num_batched_tokens=64)
    for rid in "abc":
        sched.add_request(_request(rid, toks(3, 100 * ord(rid))))
    assert sched.has_unfinished()
    assert _step(sched)[0] == [("a", 0, 3), ("b", 0, 3)]
    assert [r.request_id for r in sched.waiting] == ["c"] and len(sched.running) == 2
    assert _step(sched)[0] == [("a", 3, 1), ("b", 3, 1)]


def test_has_unfinished_while_anything_waits_or_runs() -> None:
    kv = manager(40, full(4))
    sched = _scheduler(kv, budget=8)
    assert not sched.has_unfinished()
    sched.add_request(_request("a", toks(3)))
    assert sched.has_unfinished() and not sched.running  # waiting only
    _step(sched)
    assert sched.has_unfinished() and not sched.waiting  # running only
    assert sched.abort("a") and not sched.has_unfinished()


def test_first_admission_records_the_full_attention_match() -> None:
    # Full attention + Mamba under hybrid, no tail: A (40 tokens, still running) has
    # a state only at its prompt's end (40; the floor, every 128 tokens, has none
    # below). B shares A's first 20 tokens: full attention matches 20, but there is
    # no state at 20 or below, so the hit is 0. Under lru every block boundary A
    # crossed has its state: the hit is 20 too.
    for policy, hit in (("hybrid", 0), ("lru", 20)):
        knobs = {"hybrid_tail_tokens": 0} if policy == "hybrid" else {}
        kv = manager(60, full(4), mamba(4), cache_policy=policy, **knobs)
        sched = _scheduler(kv, budget=64)
        a = _request("a", toks(40))
        sched.add_request(a)
        _step(sched)
        assert (a.num_cached_tokens, a.num_full_match_tokens) == (0, 0)
        b = _request("b", [*toks(20), *toks(20, start=900)])
        assert b.num_full_match_tokens is None  # not admitted yet
        sched.add_request(b)
        _step(sched)
        assert (b.num_cached_tokens, b.num_full_match_tokens) == (hit, 20), policy
        kv.check_integrity()


def test_a_request_looked_up_again_after_a_failed_allocation_counts_once() -> None:
    # 3 usable blocks, budget 16. A (8 tokens, 2 new ones) takes 2 blocks at step 1;
    # B (5 tokens) is looked up then, but its 2 blocks do not fit: it waits. A's
    # second token takes the third block and A ends; B is admitted at step 3. The
    # prefix-cache stats count B's lookup once, at its admission (vLLM #43736).
    kv = manager(4, full(4), log_stats=True)
    sched = _scheduler(kv, budget=16)
    sched.add_request(EngineRequest("a", toks(8), SamplingParams(max_tokens=2)))
    sched.add_request(b := _request("b", toks(5, 200)))
    assert _step(sched)[0] == [("a", 0, 8)]
    assert b.status is RequestStatus.WAITING
    assert _step(sched)[0] == [("a", 8, 1)]
    assert _step(sched)[0] == [("b", 0, 5)]
    stats = kv.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (2, 8 + 5, 0)
    kv.check_integrity()
