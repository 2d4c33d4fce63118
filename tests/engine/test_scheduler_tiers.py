"""The scheduler accounts for tier loads (no model: the real ``Scheduler`` and
manager over a planned tiny layout, tokens made up).

- A request whose loads are in flight holds no budget and no seat: the request
  behind it is admitted with the whole budget, and it runs once they land.
- When only such requests wait, the step waits for the first one's loads, and
  that wait is the step's ``load_wait`` (and ``OffloadStats.load_wait_seconds``);
  when a request ahead cannot fit for the blocks that staged loads hold, the step
  lands them and admits it.
- When recomputing is estimated cheaper than loading (``LoadCost``), the tier
  hit is not used: the request recomputes, ``skipped_slower`` counts it.
- Each step's time per token feeds the cost model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from factories import admit, toks
from tier_helpers import blocked_until_opened, computed, tiered_manager

from hybridkv import Request
from hybridkv.engine.engine_request import EngineRequest
from hybridkv.engine.sampling_params import SamplingParams
from hybridkv.engine.scheduler import Scheduler

MAX_LEN = 64
BUDGET = 32
PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)


def _setup() -> tuple:
    """Tiers whose host holds a document's units (the device reused its blocks)."""
    kv, _, tiers, copier = tiered_manager("tiny-gemma3", max_len=MAX_LEN)
    doc = toks(MAX_LEN - 16)
    r = Request("doc", doc)
    admit(kv, r)
    computed(tiers, r)  # lru: written through
    kv.free(r)
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=BUDGET, tiers=tiers)
    return kv, tiers, copier, sched, doc


def _req(rid: str, prompt: list[int]) -> EngineRequest:
    return EngineRequest(rid, prompt, PARAMS, max_model_len=MAX_LEN)


def test_a_loading_request_holds_no_budget_and_runs_once_landed() -> None:
    kv, tiers, copier, sched, doc = _setup()
    loading, other = _req("a", [*doc, 1, 2]), _req("b", toks(20, start=5000))
    sched.add_request(loading)
    sched.add_request(other)
    copier.gate.clear()
    out = sched.schedule()
    assert [(s.request.request_id, s.num_tokens) for s in out.scheduled] == [("b", 20)]
    assert out.load_wait == 0 and sched.waiting[0] is loading
    assert tiers.loading(loading.core)
    kv.check_integrity()
    tiers.check_integrity()
    sched.update(out, {"b": 7}, 0.0)
    copier.gate.set()
    copier.drain()  # the loads have landed
    out = sched.schedule()
    first = next(s for s in out.scheduled if s.request is loading)
    assert first.admitted and first.start > 0 and tiers.stats.hits == 1
    assert first.start == tiers.stats.hit_tokens
    tiers.close()


def test_when_only_loads_wait_the_step_waits_and_says_how_long() -> None:
    _, tiers, copier, sched, doc = _setup()
    loading = _req("a", [*doc, 1, 2])
    sched.add_request(loading)
    copier.gate.clear()
    out = blocked_until_opened(copier, sched.schedule)
    assert [s.request for s in out.scheduled] == [loading] and out.scheduled[0].start > 0
    assert out.load_wait >= 0.25 and tiers.stats.load_wait_seconds == out.load_wait
    tiers.close()


def test_a_hit_slower_to_load_than_to_recompute_is_recomputed() -> None:
    _, tiers, _, sched, doc = _setup()
    tiers.cost.observe_step(100, 100, 1e-9)  # recomputing measured nearly free
    sched.add_request(_req("a", [*doc, 1, 2]))
    out = sched.schedule()
    assert out.scheduled[0].start == 0 and tiers.stats.skipped_slower == 1
    assert tiers.stats.hits == 0 and tiers.stats.loads_cpu == 0
    tiers.close()


def test_each_step_feeds_the_cost_model() -> None:
    _, tiers, _, sched, _ = _setup()
    sched.add_request(_req("a", toks(30, start=7000)))
    out = sched.schedule()  # a prefill of 30 tokens
    sched.update(out, {"a": 3}, 0.0)
    assert tiers.cost.step_samples == 1 and tiers.cost.seconds_per_token is not None
    out = sched.schedule()  # a decode: not a recompute figure
    sched.update(out, {"a": 4}, 0.0)
    assert tiers.cost.step_samples == 1
    tiers.close()


def test_loads_held_behind_a_request_that_cannot_fit_are_landed_for_it() -> None:
    """``a`` and ``b`` both had their loads staged; once landed, ``a`` (first in the
    queue) adopts its hit but its new blocks do not fit, because ``b``'s landed loads
    still hold blocks. The step lands ``b`` (its blocks become cached and free) and
    admits ``a`` in the same step, instead of scheduling nothing."""
    kv, tiers, copier, sched, doc = _setup()
    other = toks(MAX_LEN - 16, start=3000)
    r = Request("other", other)
    admit(kv, r)
    computed(tiers, r)  # a second document in the host tier
    kv.free(r)
    pool = kv.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))  # the device forgets both
    a, b = _req("a", [*doc, *toks(14, start=9000)]), _req("b", [*other, 1, 2])
    c = EngineRequest("c", toks(4, start=8000), SamplingParams(max_tokens=1), max_model_len=MAX_LEN)
    for req in (a, b, c):
        sched.add_request(req)
    copier.gate.clear()
    out = sched.schedule()  # a and b staged (passed over), c runs
    assert [s.request for s in out.scheduled] == [c]
    assert tiers.loading(a.core) and tiers.loading(b.core)
    sched.update(out, {"c": 5}, 0.0)  # c finishes
    copier.gate.set()
    copier.drain()  # every load has landed; a and b still hold their blocks
    taken = pool.get_new_blocks(pool.num_free_blocks - 1)  # one free block left
    out = sched.schedule()
    assert [s.request for s in out.scheduled] == [a] and out.scheduled[0].start > 0
    assert not tiers.loading(b.core) and sched.waiting[0] is b
    pool.free_blocks(taken)
    kv.check_integrity()
    tiers.check_integrity()
    tiers.close()


def test_a_hit_staged_again_after_a_failed_landing_is_waited_for() -> None:
    """Only ``a`` waits; its loads are staged, then landed by the step (nothing else
    can run), and they fail. Admitting it again stages its hit anew: with nothing
    scheduled the step waits for those loads too, instead of returning an empty
    step (the engine then fails: "no request can be scheduled")."""
    _, tiers, copier, sched, doc = _setup()
    a = _req("a", [*doc, 1, 2])
    sched.add_request(a)
    copier.gate.clear()
    second = threading.Event()  # holds the loads staged after the failed landing
    failing = [True]
    gated = copier.submit

    def submit(fn: Callable[..., Any], *args: Any) -> Any:
        if failing[0]:
            return gated(_raise, *args)  # runs once the gate opens: a failed load

        def held(*a: Any) -> Any:
            assert second.wait(30), "the test never released the second loads"
            return fn(*a)

        return gated(held, *args)

    copier.submit = submit  # type: ignore[method-assign]
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(sched.schedule()))
    worker.start()
    worker.join(0.3)  # staged, passed over, then landed by the step: held by the gate
    assert worker.is_alive(), "the step did not wait for a's loads"
    failing[0] = False
    copier.gate.set()  # the first loads fail; the hit is staged again, held by ``second``
    worker.join(0.5)
    assert worker.is_alive(), "the step returned without waiting for a's new loads"
    second.set()
    worker.join(30)
    out = result[0]
    assert [s.request for s in out.scheduled] == [a]
    assert tiers.stats.load_failures > 0 and tiers.stats.hits == 1
    tiers.close()


def _raise(*_: Any) -> None:
    raise OSError("injected load failure")
