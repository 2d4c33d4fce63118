"""Async scheduling with the tiers: the synchronous engine's tokens, and no tier copy
before the step in flight has run (``hybridkv.offload.inflight_step``).

On the CPU a step's writes are done when it returns, so a copy issued too early
cannot be seen there; ``DeferredWrites`` (``deferred_device.py``) is a stand-in
device whose step lands its KV writes only at its fence. Under it, a swap or a
demotion of a block the step in flight computes reads the bytes from before it,
unless the tiers wait for the step first: the first test shows that the
stand-in catches exactly that (the ordering turned off, the tokens change), the
second that with the ordering the tokens are the synchronous engine's. Then hits
from the host tier and from the disk tier after a restart (against a cold engine
without tiers, itself checked against transformers by the families' oracle
tests), swap preemption against transformers, and seeded random workloads, all
under both policies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from deferred_device import DeferredWrites, fail_at_launch
from oracle import check_against_hf, random_prompt
from tier_runs import ColdEngine, evict_device, tier_hit, tiered_llm
from tiny_checkpoints import gemma3_config, jamba_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.offload.inflight_step import InFlightStep

POLICIES = ("lru", "hybrid")
TIER_GIB = 0.002
#: A chunked prefill (8 tokens a step) in a pool that preempts requests mid-prompt:
#: a victim's newest blocks are those the step in flight computes.
RACE_KW: dict[str, Any] = dict(block_size=4, max_model_len=96, max_num_batched_tokens=8,
                               kv_offloading_size=TIER_GIB, preemption_mode="swap",
                               device="cpu")  # fmt: skip
#: An async engine on the CPU (the stand-in device models a GPU's stream there).
ASYNC: dict[str, Any] = dict(max_model_len=112, async_scheduling=True, device="cpu")
#: Extra pages over the plan's minimum (``hybrid`` needs two to admit them all).
RACE_PAGES = {"lru": 0, "hybrid": 2}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3-async-tiers"))


@pytest.fixture(scope="module")
def jamba(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(jamba_config(), tmp_path_factory.mktemp("jamba-async-tiers"))


def _tokens(llm: LLM, prompts: list[list[int]], params: Any) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.manager.check_integrity()
    assert llm.tiers is not None
    llm.tiers.check_integrity()
    if llm.async_steps is not None:
        llm.async_steps.check_integrity(llm.scheduler)
    return [o.outputs[0].token_ids for o in outs]


def _race(ckpt: Path, policy: str) -> tuple[list[list[int]], list[list[int]], LLM, DeferredWrites]:
    """Six prompts of 24-29 tokens, 8 tokens each: the synchronous engine's tokens, and
    those of an async engine on the stand-in device (which, and the stand-in, returned)."""
    plan = LLM(ckpt, block_size=4, max_model_len=96, max_num_batched_tokens=8, device="cpu").plan
    memory = plan.min_memory_bytes + RACE_PAGES[policy] * plan.page_bytes
    kw = dict(RACE_KW, cache_policy=policy, kv_cache_memory_bytes=memory)
    prompts = [random_prompt(24 + i, 10 + i) for i in range(6)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = _tokens(LLM(ckpt, **kw), prompts, params)
    llm = LLM(ckpt, **kw, async_scheduling=True)
    device = DeferredWrites(llm)
    got = _tokens(llm, prompts, params)
    assert llm.tiers is not None and llm.tiers.stats.swaps > 0
    assert device.landed_bytes > 0  # the stand-in did land writes late
    return want, got, llm, device


@pytest.mark.parametrize("policy", POLICIES)
def test_the_stand_in_device_catches_a_copy_before_the_step_lands(
    gemma: Path, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(InFlightStep, "before_copy", lambda self: None)  # naive: no ordering
    want, got, _, _ = _race(gemma, policy)
    assert got != want  # a swapped or demoted unit held bytes from before its step


@pytest.mark.parametrize("policy", POLICIES)
def test_swaps_and_demotions_wait_for_the_step_in_flight(gemma: Path, policy: str) -> None:
    want, got, llm, _ = _race(gemma, policy)
    assert got == want
    assert llm.tiers is not None and llm.tiers.inflight.waits > 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("family", ["gemma3", "jamba"])
def test_host_then_disk_hits_match(
    family: str, policy: str, gemma: Path, jamba: Path, tmp_path: Path
) -> None:
    ckpt = gemma if family == "gemma3" else jamba
    cold = ColdEngine(ckpt, max_model_len=112, device="cpu")
    doc = random_prompt(96, 11)  # ends on a block boundary of every group
    past = [*doc, 7, 8, 9]
    llm = tiered_llm(ckpt, tmp_path / "disk", policy, **ASYNC)
    DeferredWrites(llm)
    assert tier_hit(ckpt, llm, doc, "CPU", cold=cold) == 0
    for prompt in (past, doc):
        evict_device(llm)
        assert tier_hit(ckpt, llm, prompt, "CPU", cold=cold) > 0, "no tier hit"
    llm.close()
    again = tiered_llm(ckpt, tmp_path / "disk", policy, **ASYNC)
    DeferredWrites(again)
    assert tier_hit(ckpt, again, past, "DISK", cold=cold) > 0
    again.close()


#: Per family (``test_tier_swap.py``'s cases): settings, extra pages per policy,
#: the prompts' length and count, tokens generated.
SWAP_CASES = {
    "jamba": ({"max_model_len": 96, "max_num_batched_tokens": 32}, {"lru": 1, "hybrid": 2},
              56, 2, 10),
    "gemma3": ({"max_model_len": 48}, {"lru": 0, "hybrid": 0}, 20, 4, 20),
}  # fmt: skip


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("family", list(SWAP_CASES))
def test_swapped_requests_match_transformers(
    family: str, policy: str, gemma: Path, jamba: Path
) -> None:
    ckpt = gemma if family == "gemma3" else jamba
    kw, pages, length, count, n = SWAP_CASES[family]
    plan = LLM(ckpt, block_size=4, device="cpu", **kw).plan  # type: ignore[arg-type]
    llm = LLM(ckpt, block_size=4, cache_policy=policy, kv_offloading_size=TIER_GIB,
              kv_cache_memory_bytes=plan.min_memory_bytes + pages[policy] * plan.page_bytes,
              preemption_mode="swap", async_scheduling=True, device="cpu", **kw)  # type: ignore[arg-type]  # fmt: skip
    DeferredWrites(llm)
    check_against_hf(ckpt, llm, [random_prompt(length, 10 + i) for i in range(count)], n)
    assert llm.tiers is not None and llm.tiers.stats.swaps > 0
    assert llm.scheduler.num_preemptions > 0
    # A victim preempted while its step was in flight got that step's token (and its
    # swap waited for the step).
    assert llm.async_steps is not None and llm.async_steps.stats["late tokens"] > 0
    llm.close()


@pytest.mark.parametrize(("policy", "seed"), [("lru", 0), ("hybrid", 1)])
def test_seeded_random_workloads(gemma: Path, policy: str, seed: int) -> None:
    # Shared prefixes, stop tokens, max_tokens from 1, a pool small enough to preempt
    # (the swap rule decides), chunks beside decodes, two calls on one engine.
    g = torch.Generator().manual_seed(seed)
    doc = torch.randint(3, 500, (16,), generator=g).tolist()

    def draw() -> tuple[list[int], SamplingParams]:
        own = torch.randint(3, 500, (int(torch.randint(1, 14, (1,), generator=g)),),
                            generator=g).tolist()  # fmt: skip
        prompt = [*doc, *own] if torch.rand(1, generator=g) < 0.6 else own
        stops = torch.randint(3, 500, (40,), generator=g).tolist()
        n = int(torch.randint(1, 12, (1,), generator=g))
        return prompt, SamplingParams(max_tokens=n, stop_token_ids=stops)

    calls = [[draw() for _ in range(6)] for _ in range(2)]
    kw = dict(block_size=4, max_num_seqs=4, max_num_batched_tokens=12, max_model_len=48,
              kv_cache_memory_bytes=40_000, cache_policy=policy,
              kv_offloading_size=TIER_GIB, device="cpu")  # fmt: skip
    runs = {}
    for on in (False, True):
        llm = LLM(gemma, **kw, async_scheduling=on)
        if on:
            DeferredWrites(llm)
        runs[on] = [_tokens(llm, [p for p, _ in c], [s for _, s in c]) for c in calls]
        llm.close()
    assert runs[True] == runs[False]
    assert llm.scheduler.num_preemptions > 0
    assert llm.tiers is not None
    stats = llm.tiers.stats
    assert stats.written_through + stats.demoted > 0  # the host tier was written
    assert policy == "hybrid" or stats.hits > 0  # (and under lru served hits)


def test_a_step_that_fails_in_flight_leaves_only_computed_blocks(
    gemma: Path, tmp_path: Path
) -> None:
    """Chunks of 32 tokens: steps 1 and 2 compute 64 tokens of the document, step 3
    fails while step 2 is in flight. Step 2's blocks reached the tiers (its stores
    waited for it), step 3's were taken out of the cache (never computed): after a
    restart the disk tier serves at most the 64 computed tokens, and exactly."""
    cold = ColdEngine(gemma, max_model_len=112, device="cpu")
    kw: dict[str, Any] = dict(ASYNC, max_num_batched_tokens=32)
    llm = tiered_llm(gemma, tmp_path / "disk", "lru", **kw)
    DeferredWrites(llm)
    fail_at_launch(llm, 3)
    doc = random_prompt(96, 11)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate([{"prompt_token_ids": doc}], SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.tiers is not None and llm.tiers.stats.written_through > 0
    llm.manager.check_integrity()
    llm.tiers.check_integrity()
    llm.close()
    again = tiered_llm(gemma, tmp_path / "disk", "lru", **kw)
    DeferredWrites(again)
    assert 0 < tier_hit(gemma, again, doc, "DISK", cold=cold) <= 64
    again.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_close_with_a_step_in_flight_persists_its_blocks_exactly(
    gemma: Path, policy: str, tmp_path: Path
) -> None:
    """Closed while its second chunk is in flight: that chunk's blocks are cached (since
    their allocation) and written to disk by ``persist``, once the step has landed; a
    restart's disk hit over them gives the cold engine's tokens."""
    cold = ColdEngine(gemma, max_model_len=112, device="cpu")
    kw: dict[str, Any] = dict(ASYNC, max_num_batched_tokens=32)
    llm = tiered_llm(gemma, tmp_path / "disk", policy, **kw)
    DeferredWrites(llm)
    doc = random_prompt(96, 11)
    for r in llm.make_requests({"prompt_token_ids": doc}, SamplingParams(max_tokens=2)):
        llm.scheduler.add_request(r)
    llm.step()  # tokens 0-31 launched
    llm.step()  # 0-31 committed, 32-63 launched: in flight
    assert llm.async_steps is not None and llm.async_steps.inflight is not None
    llm.close()
    again = tiered_llm(gemma, tmp_path / "disk", policy, **kw)
    DeferredWrites(again)
    assert tier_hit(gemma, again, doc, "DISK", cold=cold) == 64
    again.close()
