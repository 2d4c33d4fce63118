"""Granite 4.0 H on the engine vs transformers: same greedy tokens, logits within 1e-4 (fp32).

Tiny random checkpoint (``tiny_checkpoints.granite_config``): Mamba2 on layers 0 and
2, attention without positions (NoPE, Granite 4.0 H's) on 1 and 3, 4 experts (top 2)
beside the shared MLP, and every multiplier away from 1, so that each is checked.
A second checkpoint uses RoPE and no experts.

transformers before 5.23.0 normalizes the mixer's gated RMSNorm over all groups at once
(``tiny_checkpoints.hf_reference_problem``): under it the comparisons of the 2-group
checkpoints skip, saying so, and the 1-group one (like the real Granite 4.0 H) still runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import check_against_hf, device_for, random_prompt, shared_block_size
from tiny_checkpoints import granite_config, hf_reference_problem, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.models.granite import GraniteMoeHybridForCausalLM
from hybridkv.specs import MambaSpec

N = 10


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(granite_config(), tmp_path_factory.mktemp("granite"))


def _block_size(llm: LLM) -> int:
    groups = llm.kv_cache_config.kv_cache_groups
    assert any(isinstance(g.kv_cache_spec, MambaSpec) for g in groups)
    return shared_block_size(llm)


def test_prompts_of_several_lengths(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4)
    assert isinstance(llm.model, GraniteMoeHybridForCausalLM)
    bs = _block_size(llm)
    for n in (1, 5, bs, bs + 1, 2 * bs + 3):
        outs = check_against_hf(ckpt, llm, [random_prompt(n, n)], N)
        assert len(set(outs[0].outputs[0].token_ids)) >= 3


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_mixed_lengths_and_a_prefix_hit(ckpt: Path, policy: str) -> None:
    llm = LLM(ckpt, block_size=4, cache_policy=policy, max_num_batched_tokens=16)
    bs = _block_size(llm)
    prompts = [random_prompt(n, n) for n in (5, 2 * bs + 3, 1, bs)]
    check_against_hf(ckpt, llm, prompts, N)
    doc = random_prompt(2 * bs + 6, 5)
    check_against_hf(ckpt, llm, [doc[: 2 * bs]], N)
    outs = check_against_hf(ckpt, llm, [[*doc, 10, 11]], N)
    assert outs[0].num_cached_tokens == 2 * bs


def test_preemption_by_a_tiny_cache(ckpt: Path) -> None:
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=96,
        max_num_batched_tokens=32,
        cache_policy="hybrid",
        kv_cache_memory_bytes=150_000,
    )
    check_against_hf(ckpt, llm, [random_prompt(40, 10 + i) for i in range(3)], 16)
    assert llm.scheduler.num_preemptions > 0


@pytest.mark.parametrize("backend", ["native", "triton"])
def test_other_backends(ckpt: Path, backend: str) -> None:
    llm = LLM(ckpt, block_size=4, kernel_backend=backend, device=device_for(backend))
    bs = _block_size(llm)
    doc = random_prompt(2 * bs + 6, 77)
    outs = check_against_hf(ckpt, llm, [doc, [*doc[: 2 * bs], 9, 8, 7]], 4)
    assert [o.num_cached_tokens for o in outs] == [0, 2 * bs]


def test_rope_and_no_experts(tmp_path: Path) -> None:
    path = save_checkpoint(
        granite_config(position_embedding_type="rope", num_local_experts=0), tmp_path
    )
    llm = LLM(path, block_size=4)
    layer = llm.model.model.layers[1]
    assert layer.self_attn.rotary is not None and layer.block_sparse_moe is None
    check_against_hf(path, llm, [random_prompt(13, 3), random_prompt(6, 4)], N)


def test_one_group_matches_transformers_of_any_version(tmp_path: Path) -> None:
    # One group: transformers' gated RMSNorm is the same before and after 5.23.0.
    path = save_checkpoint(granite_config(mamba_n_groups=1), tmp_path)
    assert hf_reference_problem(path) == ""
    llm = LLM(path, block_size=4)
    check_against_hf(path, llm, [random_prompt(9, 33), random_prompt(23, 34)], N)


def test_unsupported_position_embeddings_are_refused_by_name() -> None:
    config = granite_config()
    config.position_embedding_type = "alibi"
    with pytest.raises(ValueError, match="position_embedding_type 'alibi' is not supported"):
        GraniteMoeHybridForCausalLM(config)
