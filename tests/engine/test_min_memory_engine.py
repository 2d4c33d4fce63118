"""The engine at the planner's minimum memory: ``hybrid`` runs what ``lru`` runs.

A tiny Gemma 3 (three sliding-window layers beside full attention) with
8-token chunks, in the smallest KV memory the planner accepts for
``max_model_len``. ``hybrid`` holds a tail while a request runs (a sliding
group's whole table at these lengths), more than the plan counts; alone, a
request now gives it up instead of preempting itself, which stopped the
synchronous engine with "no request can be scheduled" (``test_min_memory.py``
has the scheduler-level cases). ``lru``'s tokens are the reference: its
engine is checked against transformers by the family's oracle tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from oracle import random_prompt
from tiny_checkpoints import gemma3_config, save_checkpoint

from hybridkv.engine import LLM, SamplingParams

KW: dict[str, Any] = dict(block_size=4, max_model_len=48, max_num_batched_tokens=8, device="cpu")
TIERS: dict[str, Any] = dict(kv_offloading_size=0.002, preemption_mode="swap")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(gemma3_config(), tmp_path_factory.mktemp("gemma3-min-memory"))


@pytest.fixture(scope="module")
def memory(gemma: Path) -> int:
    """The plan's minimum for ``KW``."""
    return LLM(gemma, **KW).plan.min_memory_bytes


def _tokens(
    ckpt: Path, memory: int, policy: str, prompts: list[list[int]], **kw: Any
) -> list[list[int]]:
    llm = LLM(ckpt, **KW, **kw, cache_policy=policy, kv_cache_memory_bytes=memory)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.manager.check_integrity()
    llm.close()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize(("count", "tiers"), [(1, False), (2, True)])
def test_hybrid_runs_at_the_minimum_with_8_token_chunks(
    gemma: Path, memory: int, count: int, tiers: bool
) -> None:
    # One request of 24 prompt tokens; two of 24-25 with a host tier and swap
    # preemption (they preempt each other).
    prompts = [random_prompt(24 + i, 10 + i) for i in range(count)]
    kw = TIERS if tiers else {}
    want = _tokens(gemma, memory, "lru", prompts, **kw)
    assert _tokens(gemma, memory, "hybrid", prompts, **kw) == want
