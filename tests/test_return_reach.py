"""The return bonus's reach in prompt tokens (``HybridTuning.return_bonus_tokens``,
``policy.returning.effective_bonus``): a cache ``k`` times the reference's keeps a
returning prompt ``1/k`` of the turnovers, over device and host tier together
(``HybridOptions.tier_cover``, set by ``for_host_tier``); off, the bonus counts
turnovers of whatever pool holds it."""

from __future__ import annotations

import pytest
from factories import config
from test_hybrid_policy import FULL, SWA

from hybridkv import KVCacheManager
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.options import for_host_tier
from hybridkv.policy.returning import effective_bonus


def test_the_reach_caps_the_bonus_by_the_cached_tokens() -> None:
    assert effective_bonus(4.0, 0, 1e9) == 4.0  # off: turnovers, whatever the size
    assert effective_bonus(4.0, 1000, 250) == 4.0  # a small cache keeps the whole bonus
    assert effective_bonus(4.0, 1000, 500) == 2.0  # twice the reference: half the turnovers
    assert effective_bonus(4.0, 1000, 5000) == pytest.approx(0.2)
    assert effective_bonus(0.0, 1000, 5000) == 0.0  # no bonus stays none
    assert effective_bonus(4.0, 1000, 0) == 4.0  # nothing cached in full attention: as off
    # The same reach in tokens at any size, once the cap is passed:
    assert {effective_bonus(4.0, 1000, n) * n for n in (250, 400, 800, 3000)} == {1000.0}


def test_for_host_tier_spreads_the_reach_over_device_and_host() -> None:
    assert HybridOptions().tier_cover == 1.0
    assert for_host_tier(None, 40, 0).tier_cover == 1.0
    assert for_host_tier(None, 40, 160).tier_cover == 5.0
    assert for_host_tier(HybridOptions(return_bonus=2), 40, 320).tier_cover == 9.0
    with pytest.raises(ValueError, match=r"tier_cover must be a finite number >= 1, got 0.5"):
        HybridOptions(tier_cover=0.5)


def kv(num_blocks: int, reach: int, cover: float = 1.0, bonus: float = 4.0) -> KVCacheManager:
    tuning = HybridTuning(return_bonus_tokens=reach)
    return KVCacheManager(
        config(num_blocks, FULL, SWA),
        256,
        cache_policy="hybrid",
        hybrid=HybridOptions(value_weight=1.0, return_bonus=bonus, tuning=tuning, tier_cover=cover),
    )


@pytest.mark.parametrize(
    ("num_blocks", "reach", "cover", "bonus"),
    [
        (64, 0, 1.0, 4.0),  # off
        (64, 0, 8.0, 4.0),  # off, with a host: still the turnovers
        (64, 64 * 4 * 4, 1.0, 4.0),  # the reference pool itself: the whole bonus
        (64, 64 * 4 * 4, 2.0, 2.0),  # + a host as large as the device: half
        (128, 64 * 4 * 4, 1.0, 2.0),  # a device twice as large: half too
        (128, 64 * 4 * 4, 4.0, 0.5),
        (32, 64 * 4 * 4, 1.0, 4.0),  # a smaller pool: never above the bonus
    ],
)
def test_the_policy_values_returning_units_by_the_bonus_in_force(
    num_blocks, reach, cover, bonus
) -> None:
    # FULL's blocks are 4 tokens: the pool holds num_blocks x 4 full-attention tokens.
    m = kv(num_blocks, reach, cover)
    assert m.policy.return_bonus == pytest.approx(bonus)
    assert m.policy.return_factor == pytest.approx(2.0**bonus)  # weight 1
    m.check_integrity()
