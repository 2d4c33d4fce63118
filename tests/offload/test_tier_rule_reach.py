"""The engine's tiers take the return bonus's reach in tokens as the simulator
does: the host and disk rank with the device free set's weight
(``offload.tier_ranking.tier_rules``), and a demoted returning unit reaches the
host with its return factor rescaled to the host's own bonus
(``HybridPolicy.demotion_value``: ``policy.returning.host_value``), every other
class step as on the device."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tier_helpers import compute

from hybridkv import KVCacheManager, Request
from hybridkv.layouts import shipped_layout
from hybridkv.offload import BlockBytes, TieredCache
from hybridkv.offload.tier_ranking import tier_rules
from hybridkv.planning import allocate_kv_cache, plan_kv_cache
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.cost_aware import released_value
from hybridkv.policy.options import for_host_tier
from hybridkv.tiers import HostTier, ModelFingerprint
from hybridkv.tiers.spare import SPARE
from hybridkv.tiers.torch_memory import TorchHostMemory

MAX_LEN = 320


def manager(options: HybridOptions) -> KVCacheManager:
    config = plan_kv_cache(
        shipped_layout("tiny-jamba"), 2_000_000, max_model_len=MAX_LEN
    ).kv_cache_config
    return KVCacheManager(config, MAX_LEN, cache_policy="hybrid", hybrid=options)


def device_tokens(kv: KVCacheManager) -> int:
    return kv.block_pool.num_blocks * kv.policy.block_sizes[kv.policy.full_gid]


def test_the_tiers_rank_with_the_device_weight_on_and_off() -> None:
    off = manager(for_host_tier(None, 1, 8))
    tokens = device_tokens(off)
    # A reach of twice the host's tokens (8x the device's): a stay of 2 host
    # turnovers, 1 of them the bonus (of 4).
    tuned = HybridOptions(tuning=HybridTuning(return_bonus_tokens=16 * tokens))
    on = manager(for_host_tier(tuned, 1, 8))
    assert off.policy.host_return_share == 1.0
    assert on.policy.host_return_share == pytest.approx(1 / 4)
    for kv in (off, on):
        rules = tier_rules(kv)
        assert rules is not None
        host, disk = rules
        assert host.weight == disk.weight == kv.block_pool.policy.weight > 0


def keyed(kv: KVCacheManager) -> dict[int, float]:
    return {b.block_id: b.evict_key for b in kv.block_pool.policy if b.free_class is not None}


def demotions(options: HybridOptions) -> tuple[list[float], list[tuple[float, bool]]]:
    """A (256 tokens, 8 blocks), then B = A + 32 (returning), through the engine's tiers;
    then the pool reuses every block, demoting them to the host. The values the
    host's rule classed (in the order the tier stores them: by group), and for
    each valued block taken its class's value and whether B released it last."""
    kv = manager(options)
    rules = tier_rules(kv)
    assert rules is not None
    classed: list[float] = []

    def classify(value: float | None, nbytes: int) -> int:
        assert value is not None
        classed.append(value)
        return rules[0].classify(value, nbytes)

    config = kv.kv_cache_config
    host = HostTier(
        ModelFingerprint.from_kv_cache_config(config, "test weights"),
        1 << 26,
        TorchHostMemory("cpu"),
        replace(rules[0], classify=classify),
    )
    tiers = TieredCache(kv, BlockBytes(config, allocate_kv_cache(config)), host, None)
    compute(kv, tiers, Request("a", list(range(256))))
    before = keyed(kv)
    compute(kv, tiers, Request("b", [*range(256), *range(1000, 1032)]))
    by_b = {i for i, key in keyed(kv).items() if before.get(i) != key}
    policy = kv.policy
    offered = {
        b.block_id: (released_value(b), b.block_id in by_b)
        for b in kv.block_pool.policy
        if b.block_hash is not None and policy.demotion_value(b) != SPARE
    }
    pool = kv.block_pool
    taken = pool.get_new_blocks(pool.num_free_blocks)
    pool.free_blocks(taken)
    kv.check_integrity()
    return classed, [offered[b.block_id] for b in taken if b.block_id in offered]


def test_the_host_gets_a_share_of_the_return_factor_alone() -> None:
    """Weight 2 (a Mamba layout), bonus 4: factor 2 ** (4 / 2) = 4. A host of
    8x the device's tokens and a reach of twice as many: a stay of 2 host
    turnovers, 1 of them the bonus (of 4), a share of 1/4, so B's units reach
    the host at 4 ** (1/4 - 1) = 2 ** -1.5 of their
    class's value (3 half-octave classes: 1.5 of the device's 2-turnover steps,
    3 of 4 turnovers); A's units B left, at their class's value. Off, every unit
    at its class's value."""
    off = for_host_tier(None, 1, 8)
    classed, offered = demotions(off)
    assert sorted(classed) == sorted(value for value, _ in offered)
    assert any(by_b for _, by_b in offered) and not all(by_b for _, by_b in offered)
    tokens = device_tokens(manager(off))
    tuned = HybridOptions(tuning=HybridTuning(return_bonus_tokens=16 * tokens))
    classed_on, offered_on = demotions(for_host_tier(tuned, 1, 8))
    assert offered_on == offered  # the device decides alike
    want = [value * (2**-1.5 if by_b else 1.0) for value, by_b in offered]
    assert sorted(classed_on) == pytest.approx(sorted(want))
    assert sorted(classed_on) != pytest.approx(sorted(classed))
