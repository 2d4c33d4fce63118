"""The return bonus's reach in tokens reaches a replay's host tier: with
``--tuning return_bonus_tokens=N`` and ``--host-memory``, the host ranks with the
device free set's weight, on and off, and takes each unit the device evicts at the
policy's ``demotion_value`` (a returning unit's factor rescaled to the host's
``host_return_share``), the engine's rule."""

from __future__ import annotations

import pytest

import hybridkv.sim.replay as replay_module
from hybridkv import KVCacheManager
from hybridkv.layouts import shipped_layout
from hybridkv.sim import CostModel, SimOptions, device_profile, load_trace, replay_trace

ROWS = [
    {"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [0]},
    {"timestamp": 10, "input_length": 300, "output_length": 4, "hash_ids": [0]},
]


def tiers_of(write_trace, tuning: str | None):
    """The replay's policy, free set, tiers and demotion hook (device 16 MiB, host
    4x that)."""
    built = []
    real = replay_module.TieredCache

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    managers = []

    def spy_kv(*args, **kwargs):
        managers.append(KVCacheManager(*args, **kwargs))
        return managers[-1]

    layout = shipped_layout("toy-1full-3sliding")
    options = SimOptions(
        memory_bytes=2**24, host_memory_bytes=2**26, policy="hybrid", tuning=tuning
    )
    cost = CostModel.from_layout(layout, device_profile("h100"), active_params=1e6)
    mp = pytest.MonkeyPatch()
    mp.setattr(replay_module, "TieredCache", spy)
    try:
        replay_trace(layout, load_trace(write_trace(ROWS)), options, cost, manager_factory=spy_kv)
    finally:
        mp.undo()
    (cache,), (kv,) = built, managers
    # the pool's own free set, not wrapped: the policy's reuse horizon reads it
    assert kv.policy.release_times is not None
    return kv.policy, kv.block_pool.policy, cache, kv.block_pool.on_take


def test_off_the_host_ranks_with_the_device_weight(write_trace) -> None:
    policy, free_set, cache, on_take = tiers_of(write_trace, None)
    assert policy.host_return_share == 1.0  # the default reach: far over this small host
    assert cache.host.weight == free_set.weight > 0
    assert on_take.value_of == policy.demotion_value  # the engine's decision


def test_on_the_host_gets_its_own_bonus_in_the_values(write_trace) -> None:
    # A reach of one token, under the host's tokens: no stay beyond one turnover.
    policy, free_set, cache, on_take = tiers_of(write_trace, "return_bonus_tokens=1")
    assert policy.host_return_share == 0.0
    assert policy.return_bonus == 4.0  # the device keeps its bonus
    assert cache.host.weight == free_set.weight > 0  # every other class step: the device's
    assert on_take.value_of == policy.demotion_value
