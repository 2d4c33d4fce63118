"""The return bonus's reach in prompt tokens (``HybridTuning.return_bonus_tokens``,
``policy.returning.effective_bonus``): a host tier ``k`` times the reference's
(``HybridOptions.tier_cover``, set by ``for_host_tier``) keeps a returning prompt
``1/k`` of its turnovers, by a scaled weight (``host_weight_scale``); the device
keeps the bonus. Off, the bonus counts turnovers of whatever pool holds it."""

from __future__ import annotations

import pytest
from factories import config
from test_hybrid_policy import FULL, SWA

from hybridkv import KVCacheManager
from hybridkv.policy import HybridOptions, HybridTuning
from hybridkv.policy.options import for_host_tier
from hybridkv.policy.returning import effective_bonus, host_weight_scale


def test_the_reach_caps_the_bonus_by_the_cached_tokens() -> None:
    assert effective_bonus(4.0, 0, 1e9) == 4.0  # off: turnovers, whatever the size
    assert effective_bonus(4.0, 1000, 250) == 4.0  # a small cache keeps the whole bonus
    assert effective_bonus(4.0, 1000, 500) == 2.0  # twice the reference: half the turnovers
    assert effective_bonus(4.0, 1000, 5000) == pytest.approx(0.2)
    assert effective_bonus(0.0, 1000, 5000) == 0.0  # no bonus stays none
    assert effective_bonus(4.0, 1000, 0) == 4.0  # nothing cached in full attention: as off
    # The same reach in tokens at any size, once the cap is passed:
    assert {effective_bonus(4.0, 1000, n) * n for n in (250, 400, 800, 3000)} == {1000.0}


def test_the_host_weight_gives_the_host_its_own_bonus() -> None:
    assert host_weight_scale(4.0, 0, 100, 5.0) == 1.0  # off
    assert host_weight_scale(4.0, 1000, 100, 1.0) == 1.0  # no host
    assert host_weight_scale(0.0, 1000, 100, 5.0) == 1.0  # no bonus to scale
    assert host_weight_scale(4.0, 1000, 100, 2.0) == 1.0  # a host under the reach: the bonus
    # A host of 4 x 250 tokens gets 1 turnover of the device's 4: weight x 1/4.
    assert host_weight_scale(4.0, 1000, 250, 5.0) == 0.25
    assert host_weight_scale(4.0, 1000, 250, 9.0) == 0.125
    # The device's size counts only through the host's (1,000 tokens of host either way).
    assert host_weight_scale(4.0, 1000, 500, 3.0) == 0.25
    assert host_weight_scale(2.0, 1000, 500, 3.0) == 0.5  # a bonus of 2 is halved


def test_for_host_tier_records_the_host_size() -> None:
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
    ("num_blocks", "reach", "cover", "host_scale"),
    [
        (64, 0, 1.0, 1.0),  # off
        (64, 0, 8.0, 1.0),  # off, with a host: turnovers of each pool
        (64, 64 * 4 * 4, 1.0, 1.0),  # no host
        (64, 64 * 4 * 4, 2.0, 1.0),  # a host of a quarter of the reach: the whole bonus
        (64, 64 * 4 * 4, 5.0, 0.25),  # a host 4x as large: 1 turnover of it
        (128, 64 * 4 * 4, 1.0, 1.0),  # a device twice as large keeps its bonus
        (128, 64 * 4 * 4, 3.0, 0.25),  # its host holds the reach: 1 turnover
    ],
)
def test_the_policy_scales_the_host_weight_only(num_blocks, reach, cover, host_scale) -> None:
    # FULL's blocks are 4 tokens: the pool holds num_blocks x 4 full-attention tokens.
    m = kv(num_blocks, reach, cover)
    assert m.policy.return_bonus == 4.0  # the device's, in its turnovers, always
    assert m.policy.return_factor == 2.0**4  # weight 1
    assert m.policy.host_weight_scale == pytest.approx(host_scale)
    m.check_integrity()


def test_keywords_keep_the_host_size() -> None:
    tiered = for_host_tier(None, 40, 160)
    assert HybridOptions.from_knobs(tiered, hybrid_return_bonus=2).tier_cover == 5.0
