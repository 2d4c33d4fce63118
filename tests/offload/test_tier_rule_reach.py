"""The engine's tier rules (``offload.tier_ranking.tier_rules``) take the return
bonus's reach in tokens as the simulator does: the host and disk rank with the
device free set's weight times the policy's ``host_weight_scale``."""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager
from hybridkv.layouts import shipped_layout
from hybridkv.offload.tier_ranking import tier_rules
from hybridkv.planning import plan_kv_cache
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.options import for_host_tier


def rules(options: HybridOptions):
    config = plan_kv_cache(shipped_layout("tiny-jamba"), 200_000, max_model_len=64).kv_cache_config
    kv = KVCacheManager(config, 64, cache_policy="hybrid", hybrid=options)
    got = tier_rules(kv)
    assert got is not None
    return kv, got


def test_off_the_tiers_rank_with_the_device_weight() -> None:
    kv, (host, disk) = rules(for_host_tier(None, 1, 8))
    assert host.weight == disk.weight == kv.block_pool.policy.weight > 0


def test_on_the_tiers_rank_with_the_scaled_weight() -> None:
    kv, _ = rules(for_host_tier(None, 1, 8))
    device_tokens = kv.block_pool.num_blocks * kv.policy.block_sizes[kv.policy.full_gid]
    # A reach of the host's tokens (8x the device's): 1 host turnover, the bonus / 4.
    tuned = HybridOptions(tuning=HybridTuning(return_bonus_tokens=8 * device_tokens))
    kv, (host, disk) = rules(for_host_tier(tuned, 1, 8))
    assert kv.policy.host_weight_scale == pytest.approx(1 / 4)
    assert host.weight == disk.weight == pytest.approx(kv.block_pool.policy.weight / 4)
