"""Mistral and Ministral on the engine vs transformers: same greedy tokens, logits
within 1e-4 (fp32).

Tiny random checkpoints (``tiny_checkpoints``): Mistral with every layer sliding over
7 tokens, Ministral with sliding layers 0 and 2 and full attention on 1 and 3. The
prompts run past the window, so the sliding layers drop keys that full attention
would read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import check_against_hf, device_for, random_prompt
from tiny_checkpoints import WINDOW, ministral_config, mistral_config, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.models.mistral import MistralForCausalLM
from hybridkv.specs import FullAttentionSpec, SlidingWindowSpec

N = 10
CONFIGS = {"mistral": mistral_config, "ministral": ministral_config}


@pytest.fixture(scope="module", params=list(CONFIGS))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(CONFIGS[request.param](), tmp_path_factory.mktemp(request.param))


def test_the_layout_has_the_checkpoints_windows(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4)
    assert isinstance(llm.model, MistralForCausalLM)
    kinds = {type(g.kv_cache_spec) for g in llm.kv_cache_config.kv_cache_groups}
    sliding_only = "ministral" not in ckpt.name
    assert kinds == (
        {SlidingWindowSpec} if sliding_only else {SlidingWindowSpec, FullAttentionSpec}
    )
    windows = {
        g.kv_cache_spec.sliding_window
        for g in llm.kv_cache_config.kv_cache_groups
        if isinstance(g.kv_cache_spec, SlidingWindowSpec)
    }
    assert windows == {WINDOW}


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_prompts_past_the_window_and_a_prefix_hit(ckpt: Path, policy: str) -> None:
    llm = LLM(ckpt, block_size=4, cache_policy=policy, max_num_batched_tokens=11)
    outs = check_against_hf(ckpt, llm, [random_prompt(n, n) for n in (1, 5, 3 * WINDOW + 2)], N)
    assert all(len(set(o.outputs[0].token_ids)) >= 3 for o in outs)
    doc = random_prompt(30, 5)
    check_against_hf(ckpt, llm, [doc], N)
    outs = check_against_hf(ckpt, llm, [[*doc[:22], 7, 8, 9]], N)
    assert outs[0].num_cached_tokens == 20


def test_a_tiny_cache(ckpt: Path) -> None:
    # Mistral: every layer slides, so a request never holds more than its windows' blocks
    # (12 pages here, what one request needs): the others wait, and none is preempted.
    # Ministral's full layers grow until the running requests preempt each other.
    sliding_only = "ministral" not in ckpt.name
    page = LLM(ckpt, block_size=4, max_model_len=96).plan.page_bytes
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=96,
        max_num_batched_tokens=32,
        kv_cache_memory_bytes=(12 if sliding_only else 40) * page,
    )
    check_against_hf(ckpt, llm, [random_prompt(40, 10 + i) for i in range(3)], 16)
    assert (llm.scheduler.num_preemptions == 0) == sliding_only


@pytest.mark.parametrize("backend", ["native", "triton"])
def test_other_backends(ckpt: Path, backend: str) -> None:
    llm = LLM(ckpt, block_size=4, kernel_backend=backend, device=device_for(backend))
    doc = random_prompt(26, 77)
    outs = check_against_hf(ckpt, llm, [doc, [*doc[:21], 9, 8, 7]], 4)
    assert [o.num_cached_tokens for o in outs] == [0, 20]


def test_unsupported_activation_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        MistralForCausalLM(mistral_config(hidden_act="gelu"))
