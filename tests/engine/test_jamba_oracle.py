"""Jamba on the engine vs transformers: same greedy tokens, logits within 1e-4 (fp32).

Tiny random checkpoint: Mamba1 on layers 0 and 2, full attention on 1 and 3,
MoE (2 experts, top-1) on 1 and 3. Page unification makes the planner's block
size much larger than the asked 4 (a Mamba state is one page), so prefix hits
come in whole blocks of that size: a Mamba hit needs the checkpoint saved at
exactly the hit length.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle import bf16_and_fp32_logits, check_against_hf, device_for
from safetensors.torch import load_file, save_file
from tiny_checkpoints import jamba_config, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.models.build import load_model
from hybridkv.specs import MambaSpec

N = 10


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(jamba_config(), tmp_path_factory.mktemp("jamba"))


def _prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def _block_size(llm: LLM) -> int:
    """The block size the planner gave the Mamba group (all groups share it)."""
    sizes = {g.kv_cache_spec.block_size for g in llm.kv_cache_config.kv_cache_groups}
    mamba = [
        g for g in llm.kv_cache_config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)
    ]
    assert len(sizes) == 1 and len(mamba) == 1
    return sizes.pop()


def test_prompts_of_several_lengths(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4)
    bs = _block_size(llm)
    for n in (1, 5, bs, bs + 1, 2 * bs + 3):
        outs = check_against_hf(ckpt, llm, [_prompt(n, n)], N)
        assert len(set(outs[0].outputs[0].token_ids)) >= 3


@pytest.mark.parametrize("caching", [True, False])
def test_mixed_lengths_in_one_batch(ckpt: Path, caching: bool) -> None:
    llm = LLM(ckpt, block_size=4, enable_prefix_caching=caching)
    bs = _block_size(llm)
    prompts = [_prompt(n, n) for n in (5, 2 * bs + 3, 1, bs)]  # same prompts: HF results are cached
    outs = check_against_hf(ckpt, llm, prompts, N)
    assert all(len(set(o.outputs[0].token_ids)) >= 3 for o in outs)


@pytest.mark.parametrize("caching", [True, False])
def test_prefix_hit_matches(ckpt: Path, caching: bool) -> None:
    llm = LLM(ckpt, block_size=4, enable_prefix_caching=caching)
    bs = _block_size(llm)
    doc = _prompt(2 * bs + 6, 5)
    first = check_against_hf(ckpt, llm, [doc[: 2 * bs]], N)
    assert first[0].num_cached_tokens == 0
    outs = check_against_hf(ckpt, llm, [[*doc, 10, 11]], N)
    assert outs[0].num_cached_tokens == (2 * bs if caching else 0)
    # The same two-block prompt again: its last token is recomputed, so the hit is one block.
    outs = check_against_hf(ckpt, llm, [doc[: 2 * bs]], N)
    assert outs[0].num_cached_tokens == (bs if caching else 0)
    assert outs[0].outputs[0].token_ids == first[0].outputs[0].token_ids


@pytest.mark.parametrize("caching", [True, False])
def test_small_budget_many_chunks(ckpt: Path, caching: bool) -> None:
    llm = LLM(ckpt, block_size=4, max_num_batched_tokens=8, enable_prefix_caching=caching)
    bs = _block_size(llm)
    assert bs % 8 == 0 and bs > 8  # chunks of 8 start mid-block
    check_against_hf(ckpt, llm, [_prompt(bs + 1, bs + 1), _prompt(5, 5)], N)
    assert llm.num_steps >= (bs + 1 + 5) // 8 + N


def test_shared_prefix_with_a_budget_off_the_block_grid(ckpt: Path) -> None:
    # A budget of bs + 8 tokens: the first request's second chunk starts mid-block
    # (at bs + 8) and fills the Mamba checkpoint at 2 * bs, which the second request's
    # hit needs; it must wait for that step to finish, not read the unwritten state.
    llm = LLM(ckpt, block_size=4)
    bs = _block_size(llm)
    llm = LLM(ckpt, block_size=4, max_num_batched_tokens=bs + 8)
    doc = _prompt(2 * bs + 6, 78)
    outs = check_against_hf(ckpt, llm, [doc, [*doc[: 2 * bs], 9, 8, 7]], 4)
    assert [o.num_cached_tokens for o in outs] == [0, 2 * bs]


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_by_a_tiny_cache(ckpt: Path, caching: bool) -> None:
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=96,
        max_num_batched_tokens=32,
        enable_prefix_caching=caching,
        kv_cache_memory_bytes=150_000,
    )
    prompts = [_prompt(40, 10 + i) for i in range(3)]
    check_against_hf(ckpt, llm, prompts, 16)
    assert llm.scheduler.num_preemptions > 0


def test_triton_backend_matches(ckpt: Path) -> None:
    """Triton kernels: a mixed batch in chunks of 8, then a prefix hit (prompts cached above)."""
    llm = LLM(ckpt, block_size=4, kernel_backend="triton", max_num_batched_tokens=8)
    bs = _block_size(llm)
    doc = _prompt(2 * bs + 6, 5)  # the prompts of test_prefix_hit_matches
    check_against_hf(ckpt, llm, [doc[: 2 * bs], _prompt(5, 5)], N)
    outs = check_against_hf(ckpt, llm, [[*doc, 10, 11]], N)
    assert outs[0].num_cached_tokens == 2 * bs


def test_fused_expert_checkpoint_loads_the_same(ckpt: Path, tmp_path: Path) -> None:
    """transformers' fused expert tensors (gate_up_proj [E, 2I, H], down_proj) load per expert."""
    tensors = load_file(str(ckpt / "model.safetensors"))
    fused = {k: v for k, v in tensors.items() if ".experts." not in k}
    config = jamba_config()
    for i in (1, 3):
        pre = f"model.layers.{i}.feed_forward.experts"
        gate_up = [
            torch.cat([tensors[f"{pre}.{e}.{w}_proj.weight"] for w in ("gate", "up")])
            for e in range(config.num_experts)
        ]
        down = [tensors[f"{pre}.{e}.down_proj.weight"] for e in range(config.num_experts)]
        fused[f"{pre}.gate_up_proj"] = torch.stack(gate_up)  # [E, 2I, H]
        fused[f"{pre}.down_proj"] = torch.stack(down)  # [E, H, I]
    save_file(fused, str(tmp_path / "model.safetensors"))
    ours = load_model(tmp_path, config, torch.float32, torch.device("cpu")).state_dict()
    want = load_model(ckpt, config, torch.float32, torch.device("cpu")).state_dict()
    assert ours.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(ours[k], want[k], rtol=0, atol=0)


def test_bfloat16_runs_close_to_fp32(ckpt: Path) -> None:
    ours, want = bf16_and_fp32_logits(ckpt, _prompt(17, 11), 4)
    assert (ours - want).abs().max() < 0.1 * want.abs().max()


@pytest.mark.parametrize("backend", ["torch", "native", "triton"])
def test_shared_prefix_in_one_batch(ckpt: Path, backend: str) -> None:
    # Requests sharing a prefix arrive together: the second must not adopt Mamba
    # checkpoints that the first is computing in the same step.
    llm = LLM(ckpt, block_size=4, kernel_backend=backend, device=device_for(backend))
    bs = _block_size(llm)
    doc = _prompt(2 * bs + 6, 77)
    prompts = [doc, [*doc[: 2 * bs], 9, 8, 7], [*doc[: 2 * bs], 5]]
    outs = check_against_hf(ckpt, llm, prompts, 4)
    assert [o.num_cached_tokens for o in outs] == [0, 2 * bs, 2 * bs]
