"""Hits from the host and disk tiers stay token-identical to a cold engine.

Every family of ``FAMILY_CONFIGS``, under both cache policies: a document is
computed once; then the device pool reuses every block (``_evict_device``
takes all free blocks, which demotes the cached ones to the host tier, and
gives them back empty), so the next requests' hits can only come from the
host tier; then the engine is closed (the cache written to disk) and a new
``LLM`` over the same ``disk_cache_dir`` hits from disk. Prompts end on the
shared block boundary (96 tokens: 2 or 3 Mamba pages, 12 attention blocks) and
past it. Each step is checked against a cold run of the same prompt by an
engine without tiers (tokens exactly, logits at 1e-4; the cold engine is
itself checked against transformers by each family's ``test_*_oracle.py``),
and every integrity check runs after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from oracle import random_prompt, run_engine
from tiny_checkpoints import FAMILY_CONFIGS, save_checkpoint

from hybridkv.engine import LLM

DOC = random_prompt(96, 11)  # ends on every family's block boundary
PAST = [*DOC, 7, 8, 9]
BLOCK = 8  # attention blocks; Mamba models' pages hold 32 or 48 tokens
N = 2  # tokens generated per request (a prefill and a decode)
TIER_GIB = 0.002  # 2 MiB: every test unit fits


@pytest.fixture(scope="module", params=list(FAMILY_CONFIGS))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(FAMILY_CONFIGS[request.param](), tmp_path_factory.mktemp(request.param))


def _llm(ckpt: Path, disk: Path, policy: str, **kw: object) -> LLM:
    return LLM(
        ckpt,
        block_size=BLOCK,
        max_model_len=112,
        cache_policy=policy,
        kv_offloading_size=TIER_GIB,
        disk_cache_dir=str(disk),
        disk_cache_size=TIER_GIB,
        **kw,  # type: ignore[arg-type]
    )


def _evict_device(llm: LLM) -> None:
    """The pool reuses every free block (as an allocation would): what it held is
    demoted, and nothing stays cached on the device."""
    pool = llm.manager.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    assert pool.num_cached_blocks() == 0


_COLD: dict[tuple[str, tuple[int, ...]], tuple[list[int], torch.Tensor]] = {}


def _cold(ckpt: Path, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """Tokens and logits of ``prompt`` from an engine without tiers (cached)."""
    key = (str(ckpt), tuple(prompt))
    if key not in _COLD:
        outs, logits = run_engine(LLM(ckpt, block_size=BLOCK, max_model_len=112), [prompt], N)
        _COLD[key] = (outs[0].outputs[0].token_ids, logits[0])
    return _COLD[key]


def _run(ckpt: Path, llm: LLM, prompt: list[int]) -> int:
    """Run ``prompt``; check it against the cold run and every integrity check.
    Returns its prefix-hit tokens."""
    outs, logits = run_engine(llm, [prompt], N)
    tokens, ref = _cold(ckpt, prompt)
    assert outs[0].outputs[0].token_ids == tokens
    torch.testing.assert_close(logits[0], ref, rtol=1e-4, atol=1e-4)
    _check(llm)
    return int(outs[0].num_cached_tokens)


def _check(llm: LLM) -> None:
    llm.manager.check_integrity()
    assert llm.tiers is not None
    llm.tiers.check_integrity()


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_host_then_disk_hits_match_transformers(ckpt: Path, tmp_path: Path, policy: str) -> None:
    llm = _llm(ckpt, tmp_path / "disk", policy)
    tiers = llm.tiers
    assert tiers is not None
    assert _run(ckpt, llm, DOC) == 0
    for prompt in (PAST, DOC):  # past the boundary, then exactly on it
        _evict_device(llm)
        before = tiers.stats.hit_tokens
        hit = _run(ckpt, llm, prompt)
        assert hit > 0, "no tier hit"
        # The device held nothing: every hit token came from the host tier.
        assert tiers.stats.hit_tokens - before == hit
        assert tiers.stats.loads_disk == 0 and tiers.stats.load_failures == 0
    llm.close()

    again = _llm(ckpt, tmp_path / "disk", policy)  # a restart: only the disk survives
    assert again.tiers is not None
    hit = _run(ckpt, again, PAST)
    assert hit > 0
    assert again.tiers.stats.hit_tokens == hit
    assert again.tiers.stats.loads_disk > 0 and again.tiers.stats.loads_cpu == 0
    again.close()
