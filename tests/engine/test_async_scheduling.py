"""Async scheduling (``LLM(async_scheduling=True)``) gives the synchronous engine's tokens.

Each test runs the same requests through an engine with and without it and compares the
outputs (tokens, finish reasons, log-probabilities): several families, chunked prefill,
a stop token at every position, ``max_tokens`` and ``max_model_len`` ends, preemption
while a step is in flight, prefix caching, host-side sampling (settled steps, counted),
steps replayed from graphs (``EagerReplay`` on the CPU). A step's order is checked
too: the next step is launched before the tokens of the one before it are appended.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from deferred_device import fail_at_launch
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.graphs import EagerReplay, StepGraphs

FAMILIES = ("gemma3", "llama4", "jamba", "bamba")
KW: dict[str, Any] = dict(block_size=4, dtype="float32", max_num_seqs=4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``saved(family)``: its tiny checkpoint, saved once for the module."""
    paths: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in paths:
            path = tmp_path_factory.mktemp(f"{name}-async")
            paths[name] = save_checkpoint(FAMILY_CONFIGS[name](), path)
        return paths[name]

    return get


@pytest.fixture(params=FAMILIES)
def ckpt(request: pytest.FixtureRequest, saved: Any) -> Path:
    return saved(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def gemma(saved: Any) -> Path:
    return saved("gemma3")  # type: ignore[no-any-return]


def _prompts(*lengths: int, seed: int = 3) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, 500, (n,), generator=g).tolist()}
            for n in lengths]  # fmt: skip


def _outputs(llm: LLM, prompts: Any, params: Any) -> list[Any]:
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.manager.check_integrity()
    if llm.async_steps is not None:
        llm.async_steps.check_integrity(llm.scheduler)
    return [
        (o.outputs[i].token_ids, o.outputs[i].finish_reason, o.outputs[i].stop_reason,
         o.outputs[i].logprobs)
        for o in outs for i in range(len(o.outputs))
    ]  # fmt: skip


def _both(ckpt: Path, prompts: Any, params: Any, **kw: Any) -> tuple[list[Any], LLM]:
    """The outputs with async scheduling (checked equal to those without), and that LLM."""
    want = _outputs(LLM(ckpt, **{**KW, **kw}), prompts, params)
    llm = LLM(ckpt, **{**KW, **kw}, async_scheduling=True)
    assert _outputs(llm, prompts, params) == want
    return want, llm


def test_the_families_give_the_synchronous_tokens(ckpt: Path) -> None:
    # Chunked prefill (16 tokens a step) and decodes batched with chunks.
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 5, 9, 7)]
    _, llm = _both(ckpt, _prompts(5, 9, 30, 12), params, max_num_batched_tokens=16)
    stats = llm.async_steps.stats  # type: ignore[union-attr]
    assert stats["overlapped"] == llm.num_steps - 1  # the last call only applies
    assert stats["settled: host sampling"] == stats["dropped tokens"] == 0


@pytest.mark.parametrize("family", ["gemma3", "jamba"])
def test_a_stop_token_at_every_position(family: str, saved: Any) -> None:
    ckpt = saved(family)
    prompt = _prompts(11)
    free = LLM(ckpt, **KW).generate(prompt, SamplingParams(max_tokens=8), use_tqdm=False)
    ids = free[0].outputs[0].token_ids
    params = [SamplingParams(max_tokens=8, stop_token_ids=[t]) for t in ids]
    outs, llm = _both(ckpt, prompt * len(ids), params)
    assert [len(o[0]) for o in outs] == [ids.index(t) + 1 for t in ids]
    assert all(o[1] == "stop" for o in outs)
    # Each stop but at the last position (where max_tokens ends it anyway, known on the
    # host) was seen a step late: its next token was computed and dropped.
    assert llm.async_steps.stats["dropped tokens"] >= len(set(ids[:-1]))  # type: ignore[union-attr]


def test_max_tokens_and_max_model_len_waste_no_step(gemma: Path) -> None:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (1, 2, 3, 5, 40)]
    outs, llm = _both(gemma, _prompts(6, 7, 8, 9, 10), params, max_model_len=24,
                      max_num_seqs=8)  # fmt: skip
    assert [len(o[0]) for o in outs] == [1, 2, 3, 5, 14]  # the last one ends at 24 tokens
    assert llm.async_steps.stats["dropped tokens"] == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_preemption_while_a_step_is_in_flight(gemma: Path, policy: str) -> None:
    params = SamplingParams(max_tokens=14, ignore_eos=True)
    kw = dict(max_model_len=32, kv_cache_memory_bytes=40_000, cache_policy=policy)
    _, llm = _both(gemma, _prompts(10, 11, 12, 13), params, **kw)
    assert llm.scheduler.num_preemptions > 0
    # A victim's token of the step in flight reached it while it waited.
    assert llm.async_steps.stats["late tokens"] > 0  # type: ignore[union-attr]


def test_a_victim_gets_its_token_in_flight_while_it_waits(gemma: Path) -> None:
    kw = dict(max_model_len=32, kv_cache_memory_bytes=40_000)
    llm = LLM(gemma, **KW, **kw, async_scheduling=True)
    sched = llm.scheduler
    preempt, victims = sched._preempt, []

    def spy(req: Any) -> None:
        victims.append((req, req.core.num_tokens, req.num_pending_tokens))
        preempt(req)

    sched._preempt = spy  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=14, ignore_eos=True)
    for r in [x for p in _prompts(10, 11, 12, 13) for x in llm.make_requests(p, params)]:
        sched.add_request(r)
    late = 0
    while sched.has_unfinished():
        victims.clear()
        llm.step()
        for req, tokens, pending in victims:  # appended, not dropped (the resume needs it)
            assert req.core.num_tokens == tokens + pending
            late += pending
    assert late > 0


@pytest.mark.parametrize("family", ["gemma3", "jamba"])
def test_prefix_hits_across_calls_and_in_one_batch(family: str, saved: Any) -> None:
    ckpt = saved(family)
    doc = _prompts(40, seed=5)[0]["prompt_token_ids"]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    turns = [[{"prompt_token_ids": [*doc, *q]}] for q in ([3, 4], [5, 6, 7])]
    batch = [{"prompt_token_ids": [*doc, 8 + i]} for i in range(3)]
    runs = {}
    for on in (False, True):
        llm = LLM(ckpt, **KW, async_scheduling=on)
        runs[on] = [_outputs(llm, t, params) for t in turns] + [_outputs(llm, batch, params)]
        hits = llm.generate(turns[0][0], params, use_tqdm=False)[0].num_cached_tokens
        runs[on].append(hits)
    assert runs[True] == runs[False]
    assert runs[True][-1] >= 32  # the document's blocks were cached


def test_a_block_ending_in_a_pending_token_is_cached_once_it_is_known(gemma: Path) -> None:
    llm = LLM(gemma, **KW, async_scheduling=True)
    steps = llm.async_steps
    assert steps is not None
    prompt = _prompts(7)[0]["prompt_token_ids"]  # the first output ends block 1 (tokens 4-7)
    req = llm.make_requests({"prompt_token_ids": prompt}, SamplingParams(max_tokens=4))[0]
    llm.scheduler.add_request(req)
    llm.step()  # the prompt: its token 7 pending
    llm.step()  # token 7 scheduled while pending, then appended
    probe = llm.make_requests({"prompt_token_ids": [*prompt, 1, 2]})[0].core
    assert req.num_pending_tokens == 1 and req.core.num_tokens == 8
    _, hit = llm.manager.get_computed_blocks(probe, record_stats=False)
    assert hit == 4  # block 1 was not cached when its last token was pending ...
    probe = llm.make_requests({"prompt_token_ids": [*req.core.all_token_ids, 1]})[0].core
    llm.step()  # ... and is at the next allocation, once token 7 is known
    _, hit = llm.manager.get_computed_blocks(probe, record_stats=False)
    assert hit == 8


def test_steps_that_sample_on_the_host_are_settled(
    gemma: Path, caplog: pytest.LogCaptureFixture
) -> None:
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=1, ignore_eos=True),
        SamplingParams(max_tokens=6, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=6, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=6, n=2, temperature=1.0, seed=4, ignore_eos=True),
    ]
    prompts = _prompts(5, 6, 7, 8, 9)
    with caplog.at_level(logging.INFO, "hybridkv.engine.async_step"):
        _, llm = _both(gemma, prompts, params, max_num_seqs=8)
    said = [r.getMessage() for r in caplog.records if r.name == "hybridkv.engine.async_step"]
    assert len(said) == 1 and "without overlap" in said[0], said  # once, not per step
    stats = llm.async_steps.stats  # type: ignore[union-attr]
    assert stats["settled: host sampling"] == llm.num_steps
    assert stats["overlapped"] == 0
    # Greedy requests alone overlap again.
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert stats["overlapped"] > 0


def test_the_next_step_is_launched_before_the_tokens_are_read(gemma: Path) -> None:
    llm = LLM(gemma, **KW, async_scheduling=True)
    execute = llm.runner.execute
    seen: list[list[tuple[int, int]]] = []

    def launch(work: Any, pending: Any = None) -> Any:
        seen.append([(s.request.num_pending_tokens, s.request.core.num_tokens) for s in work])
        return execute(work, pending)

    llm.runner.execute = launch  # type: ignore[method-assign]
    outs = llm.generate(_prompts(5), SamplingParams(max_tokens=4, ignore_eos=True),
                        use_tqdm=False)  # fmt: skip
    assert len(outs[0].outputs[0].token_ids) == 4
    # Launch k (k >= 1) decodes the token step k-1 samples: still pending, not appended.
    assert seen == [[(0, 5)], [(1, 5)], [(1, 6)], [(1, 7)]]


@pytest.mark.parametrize("family", ["gemma3", "jamba"])
def test_replayed_steps_give_the_synchronous_tokens(family: str, saved: Any) -> None:
    ckpt = saved(family)
    kw = dict(KW, kernel_backend="triton")
    prompts = _prompts(5, 9)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 6)]
    want = _outputs(LLM(ckpt, **kw), prompts, params)
    llm = LLM(ckpt, **kw, async_scheduling=True)
    graphs = StepGraphs(llm.runner, 4, llm.max_model_len, graph_factory=EagerReplay)
    llm.runner.graphs = graphs
    assert _outputs(llm, prompts, params) == want
    assert graphs.stats["decode replays"] >= 4  # with their inputs from the device
    assert llm.async_steps.stats["overlapped"] == llm.num_steps - 1  # type: ignore[union-attr]


def test_a_failed_step_fails_both_steps_requests(gemma: Path) -> None:
    llm = LLM(gemma, **KW, async_scheduling=True)
    execute = fail_at_launch(llm, 3)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    with pytest.raises(RuntimeError, match="device lost"):
        llm.generate(_prompts(5, 6), params, use_tqdm=False)
    assert llm.last_step is not None and len(llm.last_step.scheduled) == 4  # steps 2 and 3
    assert not llm.scheduler.has_unfinished() and llm.async_steps.inflight is None  # type: ignore[union-attr]
    llm.manager.check_integrity()
    llm.runner.execute = execute  # type: ignore[method-assign]
    want = LLM(gemma, **KW).generate(_prompts(7), params, use_tqdm=False)
    got = llm.generate(_prompts(7), params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids


def test_async_scheduling_is_checked(gemma: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="async_scheduling must be True or False"):
        LLM(gemma, async_scheduling="yes")  # type: ignore[arg-type]
    assert LLM(gemma, **KW).async_steps is None  # off by default


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_random_workloads(gemma: Path, seed: int) -> None:
    # Shared prefixes, stop tokens, max_tokens from 1, a cache small enough to preempt,
    # a small token budget (chunks beside decodes), two calls on one engine.
    g = torch.Generator().manual_seed(seed)
    doc = torch.randint(3, 500, (12,), generator=g).tolist()

    def draw() -> tuple[dict[str, list[int]], SamplingParams]:
        n = int(torch.randint(1, 14, (1,), generator=g))
        own = torch.randint(3, 500, (n,), generator=g).tolist()
        prompt = [*doc, *own] if torch.rand(1, generator=g) < 0.5 else own
        stops = torch.randint(3, 500, (40,), generator=g).tolist()
        max_tokens = int(torch.randint(1, 12, (1,), generator=g))
        return {"prompt_token_ids": prompt}, SamplingParams(max_tokens=max_tokens,
                                                            stop_token_ids=stops)  # fmt: skip

    calls = [[draw() for _ in range(6)] for _ in range(2)]
    kw = dict(KW, max_num_seqs=4, max_num_batched_tokens=12, max_model_len=40,
              kv_cache_memory_bytes=40_000)  # fmt: skip
    runs = {}
    for on in (False, True):
        llm = LLM(gemma, **kw, async_scheduling=on)
        runs[on] = [_outputs(llm, [p for p, _ in c], [s for _, s in c]) for c in calls]
    assert runs[True] == runs[False]
    assert llm.scheduler.num_preemptions > 0  # the cache is small enough to preempt
