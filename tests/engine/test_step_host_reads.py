"""The host work around a graphed step: how often it reads tensors back, and the
block ids it builds the step's tables from (``StepBlockIds``), checked on the CPU.

On a GPU each read of a device tensor's values is a sync: the host waits for the
GPU, so its preparation of the next step cannot overlap this one's kernels. A
graphed decode step reads one tensor (the sampled tokens, read once for the whole
batch); the replay itself reads nothing (``test_step_graphs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from host_reads import CountValueReads
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.graphs import EagerReplay, StepGraphs


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = gemma3_config(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    return save_checkpoint(config, tmp_path_factory.mktemp("gemma3-host-reads"))


def _prompts(n: int, seed: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 30, (n,), generator=g).tolist()
    return [{"prompt_token_ids": torch.randint(3, 500, (k,), generator=g).tolist()}
            for k in lengths]  # fmt: skip


def test_a_graphed_decode_step_reads_one_tensor_back(ckpt: Path):
    llm = LLM(ckpt, kernel_backend="torch", block_size=4, dtype="float32", max_num_seqs=8)
    graphs = StepGraphs(llm.runner, 8, llm.max_model_len, graph_factory=EagerReplay)
    llm.runner.graphs = graphs
    params = SamplingParams(max_tokens=10**4, ignore_eos=True)
    for req in llm._make_requests(
        [llm._prompt_ids(p, k) for k, p in enumerate(_prompts(8, 1))], params
    ):
        llm.scheduler.add_request(req[0])
    while graphs.stats["decode replays"] < 2:
        llm.step()
    counter = CountValueReads()
    replay = EagerReplay.replay

    def uncounted_replay(graph: EagerReplay) -> None:  # the CPU stand-in reruns the model
        counter.paused = True
        try:
            replay(graph)
        finally:
            counter.paused = False

    EagerReplay.replay = uncounted_replay  # type: ignore[method-assign]
    try:
        with counter:
            out = llm.step()
    finally:
        EagerReplay.replay = replay  # type: ignore[method-assign]
    assert graphs.stats["decode replays"] == 3 and len(out.scheduled) == 8
    assert counter.reads == ["tolist"], counter.reads  # the batch's tokens, at once
    with counter:  # what a read looks like to the counter
        torch.ones(2).sum().item()
    assert counter.reads[-1] == "item"


@pytest.mark.parametrize("graphed", [False, True])
def test_step_block_ids_are_the_managers_at_every_step(ckpt: Path, graphed: bool):
    # A 7-token window over 4-token blocks drops blocks as requests grow, requests of
    # different lengths finish and a small cache preempts: every table change a step
    # meets. Each step's ids must be what the manager says then.
    llm = LLM(ckpt, kernel_backend="torch", block_size=4, dtype="float32", max_num_seqs=6,
              max_model_len=64, kv_cache_memory_bytes=40 * 1024)  # fmt: skip
    if graphed:
        llm.runner.graphs = StepGraphs(llm.runner, 6, llm.max_model_len, graph_factory=EagerReplay)
    ids, step_ids, manager, dropped = llm.runner.block_ids, llm.runner.step_ids, llm.manager, []

    def checking(work: Any) -> Any:
        got = ids(work)
        assert got == [manager.get_block_ids(s.request.request_id) for s in work]
        step_ids.check_integrity()
        dropped.append(any(0 in table for row in got for table in row))  # the null block
        return got

    llm.runner.block_ids = checking
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 9, 17, 24, 30, 12, 5, 20)]
    llm.generate(_prompts(8, 2), params, use_tqdm=False)
    assert len(dropped) > 30 and any(dropped)
    assert llm.scheduler.num_preemptions > 0
