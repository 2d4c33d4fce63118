"""``LLM(cache_policy="hybrid")`` stays token-identical to transformers.

Under ``hybrid`` the manager keeps fewer blocks (sliding/chunked blocks only
where a kept hit point needs them, Mamba states only at kept points), so the
runner writes fewer Mamba checkpoints and hits land at kept points only. These
runs put each family through prefix hits, chunks that start mid-block and
preemption by a tiny cache under ``hybrid`` (tail 512 tokens: with these short
prompts every boundary is inside the tail, so the tiny cache is what evicts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle import check_against_hf
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint

from hybridkv.engine import LLM
from hybridkv.specs import MambaSpec


def _prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


CONFIGS = FAMILY_CONFIGS


@pytest.fixture(scope="module", params=list(CONFIGS))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = CONFIGS
    return save_checkpoint(config[request.param](), tmp_path_factory.mktemp(request.param))


def test_prefix_hits_and_odd_chunks(ckpt: Path) -> None:
    llm = LLM(ckpt, block_size=4, max_num_batched_tokens=11, cache_policy="hybrid")
    assert llm.manager.coordinator.hybrid
    doc = _prompt(40, 3)
    first = check_against_hf(ckpt, llm, [doc], 6)
    assert first[0].num_cached_tokens == 0
    outs = check_against_hf(ckpt, llm, [[*doc[:30], 7, 8, 9], [*doc, 5, 6]], 6)
    bs = max(g.kv_cache_spec.block_size for g in llm.kv_cache_config.kv_cache_groups)
    # Every boundary of the first request is inside the tail: the hits are the
    # whole blocks of the shared tokens (none with Mamba layers, whose block is a page).
    assert [o.num_cached_tokens for o in outs] == [30 // bs * bs, 41 // bs * bs]


def test_preemption_by_a_tiny_cache(ckpt: Path) -> None:
    probe = LLM(ckpt, block_size=4, max_model_len=96, cache_policy="hybrid")
    # With Mamba layers a block is a whole page (8 blocks: the requests preempt each other).
    groups = probe.kv_cache_config.kv_cache_groups
    mamba = any(isinstance(g.kv_cache_spec, MambaSpec) for g in groups)
    memory = (8 if mamba else 70) * probe.plan.page_bytes
    llm = LLM(
        ckpt,
        block_size=4,
        max_model_len=96,
        max_num_batched_tokens=32,
        kv_cache_memory_bytes=memory,
        cache_policy="hybrid",
    )
    prompts = [_prompt(40, 10 + i) for i in range(3)]
    check_against_hf(ckpt, llm, prompts, 16)
    assert llm.scheduler.num_preemptions > 0


def test_unknown_policy_is_refused(ckpt: Path) -> None:
    with pytest.raises(ValueError, match="cache_policy must be one of"):
        LLM(ckpt, cache_policy="fifo")
