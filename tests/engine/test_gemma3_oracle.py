"""Gemma 3 on the engine vs transformers: same greedy tokens, logits within 1e-4 (fp32).

Tiny random checkpoint with sliding window 7 (block size 4) on three layers and
full attention on the fourth; prompts longer than the window.
"""

from __future__ import annotations

import pytest
import torch
from oracle import bf16_and_fp32_logits, check_against_hf, device_for, run_engine
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.kernels.cpu.amx import amx_available
from hybridkv.models.layers.packed_linear import describe_linears, packing_supported

N = 12


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3"))


def _prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("backend", ["native", "torch"])
def test_mixed_lengths_in_one_batch(ckpt, caching, backend):
    llm = LLM(
        ckpt,
        block_size=4,
        enable_prefix_caching=caching,
        kernel_backend=backend,
        device=device_for(backend),
    )
    prompts = [_prompt(5, 1), _prompt(13, 2), _prompt(30, 3)]
    outs = check_against_hf(ckpt, llm, prompts, N)
    assert all(len(set(o.outputs[0].token_ids)) >= 3 for o in outs)


def test_prefix_hit_matches(ckpt):
    llm = LLM(ckpt, block_size=4)
    doc = _prompt(26, 4)
    check_against_hf(ckpt, llm, [[*doc, 7, 8, 9]], N)
    outs = check_against_hf(ckpt, llm, [[*doc, 10, 11]], N)
    assert outs[0].num_cached_tokens == 24  # 6 full blocks of the shared 26 tokens


def test_small_budget_many_chunks(ckpt):
    llm = LLM(ckpt, block_size=4, max_num_batched_tokens=5)
    check_against_hf(ckpt, llm, [_prompt(23, 5), _prompt(9, 6)], N)
    assert llm.num_steps >= 23 // 5 + N


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_by_a_tiny_cache(ckpt, caching):
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=48,
        enable_prefix_caching=caching,
        kv_cache_memory_bytes=60_000,
    )
    prompts = [_prompt(20, 10 + i) for i in range(4)]
    check_against_hf(ckpt, llm, prompts, 20)
    assert llm.scheduler.num_preemptions > 0


def test_triton_backend_matches(ckpt):
    llm = LLM(ckpt, block_size=4, kernel_backend="triton", max_num_batched_tokens=8)
    check_against_hf(ckpt, llm, [_prompt(11, 7), _prompt(6, 8)], 6)


def test_bfloat16_runs_close_to_fp32(ckpt):
    ours, want = bf16_and_fp32_logits(ckpt, _prompt(17, 9), 4)
    # First step only: later steps may (rightly) pick other tokens in bf16.
    assert (ours[0] - want[0]).abs().max() < 0.05 * want[0].abs().max()


def test_shared_prefix_in_one_batch(ckpt):
    # The second and third requests hit blocks that the first fills in the same
    # step: every layer writes all K/V before any sequence attends, so it is safe.
    llm = LLM(ckpt, block_size=4)
    doc = _prompt(26, 12)
    outs = check_against_hf(ckpt, llm, [doc, [*doc[:24], 3, 4], [*doc[:24], 5]], N)
    assert [o.num_cached_tokens for o in outs] == [0, 24, 24]


def test_native_bf16_matches_torch_bf16(ckpt):
    # The fused native layer round where the eager layer rounds: in bf16 the two
    # CPU paths give logits within bf16 noise of each other.
    cpu = {"block_size": 4, "dtype": "bfloat16", "device": "cpu"}  # two CPU paths
    native = LLM(ckpt, kernel_backend="native", **cpu)
    eager = LLM(ckpt, kernel_backend="torch", **cpu)
    # Under `native` the decode-sized products run on the AMX kernel where the CPU has it.
    packed = "oneDNN packed" if packing_supported(torch.device("cpu"), torch.bfloat16) else "torch"
    native_linears = "AMX up to" if amx_available() and packed != "torch" else packed
    assert describe_linears(native.model).startswith(native_linears)
    assert describe_linears(eager.model).startswith(packed)
    prompts = [_prompt(17, 12), _prompt(5, 13)]
    outs, ours = run_engine(native, prompts, 6)
    refs, want = run_engine(eager, prompts, 6)
    for out, ref, a, b in zip(outs, refs, ours, want, strict=True):
        # Steps after the first differing token see other contexts: compare up to it.
        same = out.outputs[0].token_ids == ref.outputs[0].token_ids
        steps = (
            len(a)
            if same
            else 1
            + next(
                i
                for i, (x, y) in enumerate(
                    zip(out.outputs[0].token_ids, ref.outputs[0].token_ids, strict=True)
                )
                if x != y
            )
        )
        a, b = a[:steps].float(), b[:steps].float()
        assert (a - b).abs().max() < 0.05 * b.abs().max()
