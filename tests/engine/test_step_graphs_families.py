"""Steps replayed from graphs for the other families (``CausalLM.supports_cuda_graphs``),
as ``test_step_graphs.py`` does for Gemma 3: a captured step reads nothing back from
the device, and steps replayed (``EagerReplay`` on the CPU, CUDA graphs on a GPU)
give the eager tokens.

- Ministral and Command R7B: attention only.
- Llama 4: chunked and NoPE attention, routed experts (dense form when graphed).
- Jamba (Mamba1), Bamba and Granite 4.0 H (Mamba2): the Mamba layers' state slots
  come from static tensors; Jamba's and Granite's experts take the dense form. For
  these, prefix hits resume from a saved state inside a replayed step.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from graph_checks import captured_step_host_reads
from tiny_checkpoints import FAMILY_CONFIGS, cohere2_config, ministral_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams
from hybridkv.engine.graphs import EagerReplay, StaticStep, StepGraphs, StepShape

CUDA = torch.cuda.is_available()
TWO_LAYERS = ["sliding_attention", "full_attention"]
# The attention-only families on two layers, one sliding and one full (the interpreter
# runs every Triton program); the others on their tiny configs (every layer kind).
CONFIGS = {
    "ministral": lambda: ministral_config(num_hidden_layers=2, layer_types=TWO_LAYERS),
    "cohere2": lambda: cohere2_config(num_hidden_layers=2, layer_types=TWO_LAYERS),
    **{name: FAMILY_CONFIGS[name] for name in ("llama4", "jamba", "bamba", "granite")},
}
MAMBA = ("jamba", "bamba", "granite")


@pytest.fixture(scope="module", params=list(CONFIGS))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return save_checkpoint(CONFIGS[name](), tmp_path_factory.mktemp(f"{name}-graphs"))


@pytest.fixture(scope="module", params=MAMBA)
def mamba_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = request.param
    return save_checkpoint(CONFIGS[name](), tmp_path_factory.mktemp(f"{name}-hits"))


def _generate(llm: LLM) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 9, 12)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 5, 9)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _ask(llm: LLM) -> list[tuple[list[int], int]]:
    """Two questions on one 100-token document, one by one: (tokens, cached tokens).
    The Mamba families' blocks are 32-48 tokens (a state is one page), so the
    document holds two of them at least."""
    g = torch.Generator().manual_seed(5)
    doc = torch.randint(3, 500, (100,), generator=g).tolist()
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    outs = []
    for n in (3, 6):
        q = torch.randint(3, 500, (n,), generator=g).tolist()
        o = llm.generate({"prompt_token_ids": doc + q}, params, use_tqdm=False)[0]
        outs.append((list(o.outputs[0].token_ids), o.num_cached_tokens))
    return outs


def _replaying(llm: LLM, max_batch: int) -> StepGraphs:
    graphs = StepGraphs(llm.runner, max_batch, llm.max_model_len, graph_factory=EagerReplay)
    llm.runner.graphs = graphs
    return graphs


def test_the_families_declare_graphs(ckpt: Path) -> None:
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32")
    assert type(llm.model).supports_cuda_graphs


def test_a_captured_step_reads_nothing_back_from_the_device(ckpt: Path) -> None:
    llm = LLM(ckpt, kernel_backend="triton", block_size=4, dtype="float32")
    assert captured_step_host_reads(llm) == set()


def test_replayed_steps_give_the_eager_tokens(ckpt: Path) -> None:
    kw = dict(kernel_backend="triton", block_size=4, dtype="float32", max_num_seqs=4)
    want = _generate(LLM(ckpt, **kw))
    llm = LLM(ckpt, **kw)
    graphs = _replaying(llm, 4)
    assert _generate(llm) == want
    assert graphs.stats["decode replays"] >= 6
    assert graphs.stats["small-step replays"] >= 1  # the prompts' prefill
    llm.manager.check_integrity()


def test_prefix_hits_resume_a_saved_state_in_a_replayed_step(mamba_ckpt: Path) -> None:
    # The second question hits the document's blocks: its one small step starts
    # from the Mamba state the first question's replayed prefill saved at a block end.
    kw = dict(kernel_backend="triton", block_size=4, dtype="float32", max_num_seqs=2)
    want = _ask(LLM(mamba_ckpt, **kw))
    llm = LLM(mamba_ckpt, **kw)
    graphs = _replaying(llm, 2)
    got = _ask(llm)
    assert got == want
    assert got[1][1] >= 64, got  # a hit of whole blocks
    assert graphs.stats["small-step replays"] == 2, graphs.stats
    assert not any(k.startswith("eager") for k in graphs.stats), graphs.stats
    llm.manager.check_integrity()


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_cuda_graphs_on_the_gpu_match_the_eager_engine(ckpt: Path) -> None:
    kw = dict(device="cuda", kernel_backend="triton", block_size=4, dtype="float32")
    want = _generate(LLM(ckpt, **kw, max_num_seqs=4))
    llm = LLM(ckpt, **kw, max_num_seqs=4, cuda_graphs=True)
    assert _generate(llm) == want
    assert llm.runner.graphs is not None and llm.runner.graphs.stats["decode replays"] >= 6


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_cuda_graphs_resume_saved_states_on_the_gpu(mamba_ckpt: Path) -> None:
    kw = dict(device="cuda", kernel_backend="triton", block_size=4, dtype="float32")
    assert _ask(LLM(mamba_ckpt, **kw, cuda_graphs=True)) == _ask(LLM(mamba_ckpt, **kw))


def test_a_small_step_fills_the_mamba_state_slots_exactly(tmp_path: Path) -> None:
    # Worked example on Bamba (blocks of 48 in both groups): a request resuming at 95
    # with 3 new tokens (from entry 1's state; token 95 ends block 1 and token 97 the
    # step) and a new prompt of 4 tokens (from zeros; its last token saves), in a
    # 16-token, 4-sequence shape: 9 padding tokens over 2 padding sequences.
    path = save_checkpoint(CONFIGS["bamba"](), tmp_path / "bamba")
    llm = LLM(path, kernel_backend="triton", block_size=4, dtype="float32")
    runner = llm.runner
    groups = list(runner.config.kv_cache_groups)
    assert {g.kv_cache_spec.block_size for g in groups} == {48}
    shape = StepShape(tokens=16, seqs=4, span=128, decode=False)
    static = StaticStep.make(shape, groups, runner.buffers, llm.max_model_len, runner.device)
    ids = list(range(1000, 1100))

    def req(start: int, n: int) -> SimpleNamespace:
        core = SimpleNamespace(all_token_ids=ids)
        return SimpleNamespace(request=SimpleNamespace(core=core), start=start, num_tokens=n,
                               samples=True)  # fmt: skip

    tables = [[7, 8, 9], [3]]  # entry 2 of the first: block 9
    static.fill([req(95, 3), req(0, 4)], [tuple(t for _ in groups) for t in tables])
    (mamba,) = static.mambas
    assert static.query_start_loc.tolist() == [0, 3, 7, 8, 16]
    assert mamba.initial.tolist() == [8, -1, -1, -1]
    assert mamba.save.tolist() == [8, -1, 9, -1, -1, -1, 3] + [-1] * 9
    for layer in static.mamba.values():
        assert layer.initial_state_indices is mamba.initial
        assert layer.save_state_indices is mamba.save
        assert layer.query_start_loc is static.query_start_loc
