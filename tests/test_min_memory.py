"""At the planner's minimum memory every request runs, under both policies.

``PagePlan.min_memory_bytes`` holds one request of ``max_model_len`` tokens by
what ``lru`` holds. ``hybrid`` holds more while a request runs (its tail: with
the default 512 tokens, a sliding group's whole table here; its retained
blocks); alone, a request whose step does not fit gives all of that up
(``hybridkv.policy.shedding.alone_plan``) instead of preempting itself, which
left the engine with an empty step ("no request can be scheduled") and
re-admitted it to the same end. The scheduler runs over bookkeeping-only
managers sized by the planner; a step samples token 7.
"""

from __future__ import annotations

import random

import pytest
from factories import chunked, full, mamba, swa, toks

from hybridkv import KVCacheManager
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.scheduler import Scheduler
from hybridkv.planning.planner import fit_memory, plan_pages
from hybridkv.specs import KVCacheSpec, MambaSpec

#: Gemma 3 (three window groups beside full attention), chunks that do not start
#: on the hit step, Jamba-like and mixed layouts, a window of another block size.
LAYOUTS: dict[str, dict[str, KVCacheSpec]] = {
    "gemma": {"s0": swa(4, 7), "s1": swa(4, 7), "s2": swa(4, 7), "f": full(4)},
    "window": {"s": swa(4, 5)},
    "chunked": {"c": chunked(4, 6), "f": full(4)},
    "mamba": {"m": mamba(4), "f": full(4)},
    "mixed": {"m": mamba(4), "s": swa(4, 6), "f": full(4)},
    "block8": {"s": swa(8, 5), "f": full(4)},
}


def _at_minimum(
    specs: dict[str, KVCacheSpec], policy: str, max_model_len: int, chunk: int, seqs: int = 4
) -> tuple[KVCacheManager, Scheduler]:
    pages = plan_pages(
        specs, block_size=4, max_model_len=max_model_len, max_num_batched_tokens=chunk
    )
    plan = fit_memory(pages, pages.min_memory_bytes)
    kv = KVCacheManager(plan.kv_cache_config, max_model_len, cache_policy=policy)
    mamba_groups = any(isinstance(s, MambaSpec) for s in specs.values())
    sched = Scheduler(
        kv, max_num_seqs=seqs, max_num_batched_tokens=chunk, defer_pending_hits=mamba_groups
    )
    return kv, sched


def _request(rid: str, prompt: list[int], max_tokens: int) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def _run(kv: KVCacheManager, sched: Scheduler, max_steps: int = 5_000) -> int:
    """Steps until every request finished; fails on a step that schedules nothing."""
    for steps in range(max_steps):
        if not sched.has_unfinished():
            return steps
        out = sched.schedule()
        assert out.scheduled, f"step {steps} scheduled nothing (preempted {out.preempted})"
        sched.update(out, {s.request.request_id: 7 for s in out.scheduled if s.samples}, 0.0)
        kv.check_integrity()
    raise AssertionError(f"unfinished after {max_steps} steps")


def test_a_lone_request_gives_up_its_tail_rather_than_preempt_itself() -> None:
    # Full attention + a window of 4, blocks of 4, 4-token steps, max_model_len 16:
    # the plan holds 4 full + 3 window blocks and the null block (8). r: 12 prompt
    # tokens, 3 outputs. After its prompt it holds full [1, 3, 5] and window
    # [2, 4, 6] under hybrid (lru has released window block 2: its query at 12 reads
    # tokens 9-11 only), 1 block free. The decode at 12 needs a block per group:
    # short by 1, nothing retained to shed. Alone, r keeps no point (it had its
    # prompt's end, 12) and gives its tail up: window entries 0-1 (blocks 2, 4)
    # return and the step takes them. Before, r preempted itself: an empty step.
    kv, sched = _at_minimum({"f": full(4), "s": swa(4, 4)}, "hybrid", 16, 4)
    assert kv.kv_cache_config.num_blocks == 8
    r = _request("r", toks(12), 3)
    sched.add_request(r)
    for start in (0, 4, 8):
        out = sched.schedule()
        assert [(s.start, s.num_tokens) for s in out.scheduled] == [(start, 4)]
        sched.update(out, {"r": 7} if start == 8 else {}, 0.0)
    states = [m.states["r"] for m in kv.coordinator.managers]
    assert kv.get_block_ids("r") == ([1, 3, 5], [2, 4, 6])
    assert [(st.kept, st.holds_tail) for st in states] == [((12,), True)] * 2
    assert kv.block_pool.num_free_blocks == 1
    out = sched.schedule()
    assert out.preempted == () and [(s.start, s.num_tokens) for s in out.scheduled] == [(12, 1)]
    assert kv.get_block_ids("r") == ([1, 3, 5, 2], [0, 0, 6, 4])
    assert [(st.kept, st.holds_tail) for st in states] == [((), False)] * 2
    sched.update(out, {"r": 7}, 0.0)
    kv.check_integrity()
    assert _run(kv, sched) == 1 and r.status.finished


def test_a_tail_given_up_is_not_taken_when_the_step_still_does_not_fit() -> None:
    # The same layout; r has 8 prompt tokens (full [1, 3], window [2, 4]) and the 3
    # free blocks are held elsewhere (as a tier's staged loads hold them). Its decode
    # at 8 needs a block per group; giving its tail up would return window entry 0
    # only (its query at 9 reads tokens 6-8): 1 < 2, so the allocation fails with
    # nothing changed (the tail, the kept point, the free set).
    kv, _ = _at_minimum({"f": full(4), "s": swa(4, 4)}, "hybrid", 16, 4)
    r = _request("r", toks(8), 3).core
    blocks, hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, 4, hit, blocks) is not None
    r.num_computed_tokens = 4
    assert kv.allocate_slots(r, 4) is not None
    r.num_computed_tokens = 8
    r.append_output_token_ids(7)
    held = kv.block_pool.get_new_blocks(kv.block_pool.num_free_blocks)
    kv.coordinator.other_holders.append(lambda: held)
    states = [m.states["r"] for m in kv.coordinator.managers]
    before = kv.get_block_ids("r"), [(st.kept, st.holds_tail) for st in states]
    assert before == (([1, 3], [2, 4]), [((8,), True)] * 2)
    assert kv.allocate_slots(r, 1) is None
    assert (kv.get_block_ids("r"), [(st.kept, st.holds_tail) for st in states]) == before
    kv.check_integrity()
    kv.block_pool.free_blocks(held[:1])  # one block back: with the tail given up, it fits
    del held[:1]
    assert kv.allocate_slots(r, 1) is not None
    assert [(st.kept, st.holds_tail) for st in states] == [((), False)] * 2
    assert kv.get_block_ids("r")[1][0] == 0  # window entry 0 returned
    kv.check_integrity()


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_one_request_of_max_model_len_runs_at_the_minimum(layout: str, policy: str) -> None:
    for max_model_len, chunk in [(16, 4), (24, 8), (48, 8), (48, 16), (64, 5)]:
        for outputs in (1, max_model_len // 3):
            kv, sched = _at_minimum(LAYOUTS[layout], policy, max_model_len, chunk)
            sched.add_request(_request("r", toks(max_model_len - outputs), outputs))
            _run(kv, sched)
            assert sched.num_preemptions == 0


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_seeded_random_workloads_at_the_minimum_finish(policy: str) -> None:
    # Shared prefixes (hits, kept points, retained blocks), any chunk size, 1-4
    # seats: preemptions happen, every request finishes, no step is empty.
    rng = random.Random(7)
    preempted = 0
    for _ in range(150):
        layout = rng.choice(list(LAYOUTS))
        max_model_len, chunk = rng.choice([16, 24, 32, 48]), rng.choice([4, 5, 8, 12, 32])
        kv, sched = _at_minimum(LAYOUTS[layout], policy, max_model_len, chunk, rng.choice([1, 4]))
        doc = toks(rng.randint(1, max_model_len), 5000)
        for i in range(rng.randint(1, 6)):
            n = rng.randint(2, max_model_len)
            outputs = rng.randint(1, n - 1)
            own = toks(max_model_len, 100 + 1000 * i)
            prompt = ([*doc, *own] if rng.random() < 0.5 else own)[: n - outputs]
            sched.add_request(_request(str(i), prompt, outputs))
        _run(kv, sched)
        preempted += sched.num_preemptions
    assert preempted > 0
