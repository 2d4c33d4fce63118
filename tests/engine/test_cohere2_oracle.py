"""Cohere 2 (Command R7B) on the engine vs transformers: same greedy tokens, logits
within 1e-4 (fp32).

Tiny random checkpoint (``tiny_checkpoints.cohere2_config``): sliding layers 0-2 over
7 tokens with RoPE on adjacent pairs, a full layer 3 with no positions, attention
and MLP in parallel from one LayerNorm, tied embeddings and a logit scale of 0.5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import check_against_hf, device_for, random_prompt
from tiny_checkpoints import WINDOW, cohere2_config, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.models.cohere2 import Cohere2ForCausalLM

N = 10


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(cohere2_config(), tmp_path_factory.mktemp("cohere2"))


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_prompts_past_the_window_and_a_prefix_hit(ckpt: Path, policy: str) -> None:
    llm = LLM(ckpt, block_size=4, cache_policy=policy, max_num_batched_tokens=11)
    assert isinstance(llm.model, Cohere2ForCausalLM)
    assert llm.model.lm_head.weight is llm.model.model.embed_tokens.weight
    outs = check_against_hf(ckpt, llm, [random_prompt(n, n) for n in (1, 5, 3 * WINDOW + 2)], N)
    assert all(len(set(o.outputs[0].token_ids)) >= 3 for o in outs)
    doc = random_prompt(30, 5)
    check_against_hf(ckpt, llm, [doc], N)
    outs = check_against_hf(ckpt, llm, [[*doc[:22], 7, 8, 9]], N)
    assert outs[0].num_cached_tokens == 20


def test_preemption_by_a_tiny_cache(ckpt: Path) -> None:
    page = LLM(ckpt, block_size=4, max_model_len=96).plan.page_bytes
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=96,
        max_num_batched_tokens=32,
        kv_cache_memory_bytes=66 * page,  # one request of 96 tokens needs 58
    )
    check_against_hf(ckpt, llm, [random_prompt(40, 10 + i) for i in range(3)], 16)
    assert llm.scheduler.num_preemptions > 0


@pytest.mark.parametrize("backend", ["native", "triton"])
def test_other_backends(ckpt: Path, backend: str) -> None:
    llm = LLM(ckpt, block_size=4, kernel_backend=backend, device=device_for(backend))
    doc = random_prompt(26, 77)
    outs = check_against_hf(ckpt, llm, [doc, [*doc[:21], 9, 8, 7]], 4)
    assert [o.num_cached_tokens for o in outs] == [0, 20]
