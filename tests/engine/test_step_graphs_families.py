"""Steps replayed from graphs for the other attention-only families: Ministral and
Command R7B (``CausalLM.supports_cuda_graphs``), as ``test_step_graphs.py`` does for
Gemma 3: a captured step reads nothing back from the device, and decode steps
replayed (``EagerReplay`` on the CPU, CUDA graphs on a GPU) give the eager tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from graph_checks import captured_step_host_reads
from tiny_checkpoints import cohere2_config, ministral_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.graphs import EagerReplay, StepGraphs

CUDA = torch.cuda.is_available()
# Two layers each, one sliding and one full: the interpreter runs every Triton program.
CONFIGS = {
    "ministral": lambda: ministral_config(
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"]
    ),
    "cohere2": lambda: cohere2_config(
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"]
    ),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return save_checkpoint(CONFIGS[name](), tmp_path_factory.mktemp(f"{name}-graphs"))


def _generate(llm: LLM) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 9, 12)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 5, 9)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_the_families_declare_graphs(ckpt: Path) -> None:
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32")
    assert type(llm.model).supports_cuda_graphs


def test_a_captured_step_reads_nothing_back_from_the_device(ckpt: Path) -> None:
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32")
    assert captured_step_host_reads(llm) == set()


def test_replayed_decode_steps_give_the_eager_tokens(ckpt: Path) -> None:
    kw = dict(kernel_backend="triton", block_size=4, dtype="float32", max_num_seqs=4)
    want = _generate(LLM(ckpt, **kw))
    llm = LLM(ckpt, **kw)
    graphs = StepGraphs(llm.runner, 4, llm.max_model_len, graph_factory=EagerReplay)
    llm.runner.graphs = graphs
    assert _generate(llm) == want
    assert graphs.stats["decode replays"] >= 6
    llm.manager.check_integrity()


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_cuda_graphs_on_the_gpu_match_the_eager_engine(ckpt: Path) -> None:
    kw = dict(device="cuda", kernel_backend="triton", block_size=4, dtype="float32")
    want = _generate(LLM(ckpt, **kw, max_num_seqs=4))
    llm = LLM(ckpt, **kw, max_num_seqs=4, cuda_graphs=True)
    assert _generate(llm) == want
    assert llm.runner.graphs is not None and llm.runner.graphs.stats["decode replays"] >= 6
