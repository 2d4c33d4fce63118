"""Swap preemption on the engine: token-identical to transformers, swaps counted.

A device pool too small for the batch forces preemptions; with
``preemption_mode="swap"`` each preempted request's units (up to its swap
point) go to the host tier once it is freed, and its resume restores them through the
normal load path (or finds them still on the device). Tiny Jamba (Mamba +
full attention; a Mamba group's swap point is its last kept state, 32-token
blocks) and tiny Gemma 3 (sliding window + full attention), under both cache
policies: every output equals transformers' greedy tokens (logits within
1e-4), the integrity checks hold, and the counters show the swaps. With
``preemption_mode`` unset under ``hybrid`` the swap rule copies nothing (the
pool demotes what it reuses), and the outputs match too.
"""

from __future__ import annotations

import pytest
from oracle import check_against_hf, random_prompt
from tiny_checkpoints import gemma3_config, jamba_config, save_checkpoint

from hybridkv.engine import LLM

TIER_GIB = 0.002

#: Per family: its config, the engine's settings, extra pages over the plan's
#: minimum per policy (so that a request is preempted past a kept state), the
#: prompts' length and count, and tokens generated.
CASES = {
    "jamba": (
        jamba_config,
        {"max_model_len": 96, "max_num_batched_tokens": 32},
        {"lru": 1, "hybrid": 2},
        56,
        2,
        10,
    ),
    "gemma3": (gemma3_config, {"max_model_len": 48}, {"lru": 0, "hybrid": 0}, 20, 4, 20),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    config, kw, pages, length, count, n = CASES[request.param]
    ckpt = save_checkpoint(config(), tmp_path_factory.mktemp(request.param))
    plan = LLM(ckpt, block_size=4, **kw).plan  # type: ignore[arg-type]
    memory = {p: plan.min_memory_bytes + k * plan.page_bytes for p, k in pages.items()}
    return ckpt, kw, memory, length, count, n


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_swapped_requests_match_transformers(case: tuple, policy: str) -> None:
    ckpt, kw, memory, length, count, n = case
    llm = LLM(
        ckpt,
        block_size=4,
        kv_cache_memory_bytes=memory[policy],
        cache_policy=policy,
        kv_offloading_size=TIER_GIB,
        preemption_mode="swap",
        **kw,
    )
    prompts = [random_prompt(length, 10 + i) for i in range(count)]
    check_against_hf(ckpt, llm, prompts, n)
    assert llm.tiers is not None
    stats = llm.tiers.stats
    assert llm.scheduler.num_preemptions > 0
    assert stats.swaps > 0 and stats.swapped_tokens > 0
    assert stats.swaps_declined == 0  # "swap": never left to the cost model
    # A swap point is a kept boundary (a Mamba state is kept only at block ends).
    step = max(g.kv_cache_spec.block_size for g in llm.kv_cache_config.kv_cache_groups)
    assert stats.swapped_tokens % step == 0
    llm.close()


def test_the_default_rule_copies_nothing_hybrid_demotes(case: tuple) -> None:
    """``preemption_mode`` None under ``hybrid``: every preempted request's units
    are demoted if the pool reuses them, so none is copied (the swap rule,
    ``offload/swap_decision.py``), and the outputs still match transformers."""
    ckpt, kw, memory, length, count, n = case
    llm = LLM(
        ckpt,
        block_size=4,
        kv_cache_memory_bytes=memory["hybrid"],
        cache_policy="hybrid",
        kv_offloading_size=TIER_GIB,
        **kw,
    )
    prompts = [random_prompt(length, 10 + i) for i in range(count)]
    check_against_hf(ckpt, llm, prompts, n)
    assert llm.tiers is not None
    stats = llm.tiers.stats
    assert llm.scheduler.num_preemptions > 0
    assert stats.swaps == 0 and stats.swapped_units == 0 and stats.swaps_declined == 0
    assert stats.swaps_unneeded > 0
    llm.close()
