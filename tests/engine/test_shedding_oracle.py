"""Shedding in the engine: token-identical to transformers while running
requests give up kept points under pressure (``hybridkv.policy.shedding``).

Gemma 3 (tiny: window 7, blocks of 4) under ``hybrid`` with no tail, so that a
running request retains its admission hit's window once it has moved past it.
A 24-token document is served first; three requests share its first 16
tokens (a kept point at 16) and decode 24 tokens each in a cache of 60
pages: steps run out of free blocks, and the newest request that retains
blocks sheds them (the runner never reads them again) before any preemption.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle import check_against_hf
from tiny_checkpoints import gemma3_config, save_checkpoint

import hybridkv.policy.shedding as shedding
from hybridkv import KVCacheManager
from hybridkv.engine import LLM


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


def test_requests_shed_kept_points_and_stay_token_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = save_checkpoint(gemma3_config(), tmp_path / "gemma3")
    probe = LLM(ckpt, block_size=4, max_model_len=96, cache_policy="hybrid")
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=96,
        max_num_batched_tokens=32,
        kv_cache_memory_bytes=60 * probe.plan.page_bytes,
        cache_policy="hybrid",
    )
    # The same manager with no tail (LLM keeps the default 512 tokens, past
    # which these short requests never get): scheduler and runner share it.
    manager = KVCacheManager(
        llm.kv_cache_config,
        llm.manager.max_model_len,
        cache_policy="hybrid",
        hybrid_tail_tokens=0,
        log_stats=True,
    )
    llm.manager = llm.scheduler.manager = llm.runner.manager = manager
    shed: list[str] = []
    real_plan = shedding.shed_plan

    def counting_plan(managers, request_id):  # type: ignore[no-untyped-def]
        shed.append(request_id)
        return real_plan(managers, request_id)

    monkeypatch.setattr(shedding, "shed_plan", counting_plan)
    doc = _prompt(24, 1)
    check_against_hf(ckpt, llm, [doc], 2)
    prompts = [[*doc[:16], *_prompt(12, 10 + i)] for i in range(3)]
    outs = check_against_hf(ckpt, llm, prompts, 24)
    # The document kept no window at 16 (no tail): the first request finds only
    # full attention there, keeps 16 as its branch point, and the others hit it.
    assert [o.num_cached_tokens for o in outs] == [0, 16, 16]
    assert shed, "no request shed: the test no longer puts the cache under pressure"
