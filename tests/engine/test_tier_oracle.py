"""Hits from the host and disk tiers stay token-identical to transformers.

Every family of ``FAMILY_CONFIGS`` and Mistral (every layer sliding), under
both cache policies: a document is computed once; then the device pool reuses
every block (``evict_device``: the cached ones are demoted to the host tier),
so the next requests' hits can only come from the host tier; then the engine
is closed (the cache written to disk) and a new ``LLM`` over the same
``disk_cache_dir`` hits from disk. Prompts end on the shared block boundary
(96 tokens: 2 or 3 Mamba pages, 12 attention blocks) and past it. Each run is
checked against a cold run of the same prompt by an engine without tiers
(tokens exactly, logits at 1e-4; the cold engine is itself checked against
transformers by each family's ``test_*_oracle.py``: ``tier_runs.ColdEngine``)
and every integrity check runs after it. The window edges, chunk boundaries, the
Triton backend (``test_tier_oracle_edges.py``) and Mamba states at each kind
of kept point (``test_tier_oracle_mamba.py``) have their own files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oracle import random_prompt
from tier_runs import ColdEngine, evict_device, tier_hit, tiered_llm
from tiny_checkpoints import FAMILY_CONFIGS, mistral_config, save_checkpoint

DOC = random_prompt(96, 11)  # ends on every family's block boundary
PAST = [*DOC, 7, 8, 9]
MAX_LEN = 112
CONFIGS = {**FAMILY_CONFIGS, "mistral": mistral_config}


@pytest.fixture(scope="module", params=list(CONFIGS))
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(CONFIGS[request.param](), tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def cold(ckpt: Path) -> ColdEngine:
    return ColdEngine(ckpt, max_model_len=MAX_LEN)


@pytest.mark.parametrize("policy", ["lru", "hybrid"])
def test_host_then_disk_hits_match_transformers(
    ckpt: Path, cold: ColdEngine, tmp_path: Path, policy: str
) -> None:
    llm = tiered_llm(ckpt, tmp_path / "disk", policy, max_model_len=MAX_LEN)
    assert tier_hit(ckpt, llm, DOC, "CPU", cold=cold) == 0
    for prompt in (PAST, DOC):  # past the boundary, then exactly on it
        evict_device(llm)
        assert tier_hit(ckpt, llm, prompt, "CPU", cold=cold) > 0, "no tier hit"
    llm.close()

    again = tiered_llm(ckpt, tmp_path / "disk", policy, max_model_len=MAX_LEN)  # a restart
    assert again.tiers is not None
    assert again.tiers.host.used_bytes == 0  # only the disk survives
    assert tier_hit(ckpt, again, PAST, "DISK", cold=cold) > 0
    again.close()
