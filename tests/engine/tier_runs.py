"""Helpers of the tier oracle tests: an engine with a host and a disk tier, a
device pool emptied into them, and runs checked against transformers whose
whole prefix hit must come from one tier.

``evict_device`` makes the pool reuse every free block, as an allocation
would: what the policy finds worth it is demoted to the host tier and nothing
stays cached on the device. ``drop_host`` then evicts every host entry (an
explicit eviction spills nothing to disk), so the next hit can only come from
the disk tier. ``tier_hit`` runs one prompt, checks its tokens exactly and
its logits within 1e-4 against a reference and runs every integrity check,
and checks that every hit token was loaded from ``medium``. The reference is
transformers in float64 (``check_against_hf``), or, where a test runs many
families (``test_tier_oracle.py``), a cold engine without tiers
(``ColdEngine``), itself checked against transformers by each family's
``test_*_oracle.py``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from oracle import check_against_hf, run_engine

from hybridkv.engine import LLM

BLOCK = 8  # attention blocks; Mamba models' pages hold 32 or 48 tokens
N = 2  # tokens generated per probe (a prefill and a decode)
TIER_GIB = 0.004  # 4 MiB per tier: every test's units fit


def tiered_llm(ckpt: Path, disk: Path, policy: str, **kw: object) -> LLM:
    """An engine with a host tier and a disk tier in ``disk`` (``kw`` overrides)."""
    settings: dict[str, object] = {
        "block_size": BLOCK,
        "cache_policy": policy,
        "kv_offloading_size": TIER_GIB,
        "disk_cache_dir": str(disk),
        "disk_cache_size": TIER_GIB,
    }
    return LLM(ckpt, **{**settings, **kw})  # type: ignore[arg-type]


def evict_device(llm: LLM) -> None:
    """The pool reuses every free block: what it held is demoted, nothing stays cached."""
    pool = llm.manager.block_pool
    pool.free_blocks(pool.get_new_blocks(pool.num_free_blocks))
    assert pool.num_cached_blocks() == 0


def drop_host(llm: LLM, on_device: bool = False) -> None:
    """Evict every host-tier entry (nothing spills): only the disk tier holds units.
    ``on_device``: only the entries whose block the device pool also holds cached (so
    that its next demotion, by its own value, decides whether the host has it)."""
    assert llm.tiers is not None
    host, cached = llm.tiers.host, llm.manager.block_pool.cached
    held = host.keys()  # a list: evicting does not change it
    for key in held:
        if not on_device or key.block_hash in cached[key.group_id]:
            assert host.evict(key), f"host entry {key} is pinned or in flight"
    assert on_device or host.used_bytes == 0


class ColdEngine:
    """Tokens and logits of prompts from an engine on ``ckpt`` without tiers (cached)."""

    def __init__(self, ckpt: Path, **kw: object) -> None:
        self.llm = LLM(ckpt, **{"block_size": BLOCK, **kw})  # type: ignore[arg-type]
        self._seen: dict[tuple[int, ...], tuple[list[int], torch.Tensor]] = {}

    def check(self, llm: LLM, prompt: list[int], n: int) -> int:
        """Run ``prompt`` on ``llm``: the cold engine's tokens and logits (1e-4), every
        integrity check. Returns its prefix hit."""
        key = (*prompt, -n)
        if key not in self._seen:
            outs, logits = run_engine(self.llm, [prompt], n)
            self._seen[key] = (outs[0].outputs[0].token_ids, logits[0])
        tokens, ref = self._seen[key]
        outs, logits = run_engine(llm, [prompt], n)
        assert outs[0].outputs[0].token_ids == tokens
        torch.testing.assert_close(logits[0], ref, rtol=1e-4, atol=1e-4)
        llm.manager.check_integrity()
        assert llm.tiers is not None
        llm.tiers.check_integrity()
        return int(outs[0].num_cached_tokens)


def tier_hit(
    ckpt: Path,
    llm: LLM,
    prompt: list[int],
    medium: str,
    n: int = N,
    cold: ColdEngine | None = None,
) -> int:
    """Run ``prompt`` against transformers (or ``cold``) on an emptied device; every
    hit token must come from the ``medium`` tier ("CPU" or "DISK"). Returns the hit."""
    tiers = llm.tiers
    assert tiers is not None
    stats = tiers.stats
    before = (stats.hit_tokens, stats.loads_cpu, stats.loads_disk, stats.load_failures)
    if cold is not None:
        hit = cold.check(llm, prompt, n)
    else:
        hit = int(check_against_hf(ckpt, llm, [prompt], n)[0].num_cached_tokens)
    hit_tokens, cpu, disk = (
        stats.hit_tokens - before[0],
        stats.loads_cpu - before[1],
        stats.loads_disk - before[2],
    )
    assert hit_tokens == hit, f"{hit} hit tokens, {hit_tokens} from the tiers"
    assert stats.load_failures == before[3]
    if hit:
        assert (cpu > 0, disk > 0) == (medium == "CPU", medium == "DISK"), (medium, cpu, disk)
    return hit
