"""The snapshot floor's spacing learned online (``hybridkv/policy/floor_tuner.py``).

Worked by hand on a floor of 1,000 tokens, hit step 10, a point costing 10
full-attention tokens: the levels are 1,000, 500 and 250; halving from 1,000 to 500
moves ``10/500 - 10/1000 = 0.01`` of full attention's memory, priced at the hit rate.
"""

from __future__ import annotations

import pytest
from factories import config, full, mamba

from hybridkv import KVCacheManager, Request
from hybridkv.policy.floor_tuner import FloorTuner
from hybridkv.policy.tuning import DEFAULT_TUNING as T

FULL, MAMBA = full(4), mamba(4)

DECAY, WINDOW = T.floor_decay, T.floor_window


def _tuner() -> FloorTuner:
    return FloorTuner(1000, 10.0, 10)


def test_levels_halve_on_the_step_down_to_a_quarter() -> None:
    assert _tuner().levels == [1000, 500, 250]
    assert FloorTuner(17_920, 560.0, 80).levels == [17_920, 8_960, 4_480]  # Jamba
    # Granite 4.0 H Tiny: 18,000 on a 400-token step; 4,400 is below a quarter.
    assert FloorTuner(18_000, 2_000.0, 400).levels == [18_000, 8_800]
    assert FloorTuner(80, 5.0, 80).levels == [80]  # nothing below one step
    for base, cost, step in ((0, 1.0, 10), (15, 1.0, 10), (100, 0.0, 10)):
        with pytest.raises(ValueError):
            FloorTuner(base, cost, step)


def test_a_floor_that_misses_deep_branches_is_halved() -> None:
    t = _tuner()
    # 50 requests branch at 900 with nothing below: the floor's point at 0 served as
    # well as it could, and a point every 500 would have given 500 each. 49 more
    # resume where an earlier prompt ended (hit = match = 500): no evidence.
    for _ in range(50):
        assert t.observe(900, 0, 1000) == 1000
    for _ in range(WINDOW - 51):
        assert t.observe(500, 500, 1000) == 1000
    # Gain 25,000 / 100,000 = 0.25 a token; price 0.01 x hit rate 0.245 = 0.00245.
    assert t.observe(500, 500, 1000) == 500
    assert t.spacing == 500 and t.level == 1
    assert t.gain_halving == pytest.approx(25_000 * DECAY)
    assert t.prompt_tokens == pytest.approx(100_000 * DECAY)
    assert t.hit_tokens == pytest.approx(WINDOW * 0 + 50 * 500 * DECAY)
    t.check_integrity()


def test_a_floor_no_hit_uses_goes_back_and_one_that_serves_stays() -> None:
    t = _tuner()
    t.level = 1  # every 500
    # Hits on the 500 grid between the 1,000s: the sparser floor would lose each.
    for _ in range(WINDOW):
        t.observe(700, 500, 1000)
    # Loss 500 a request (0.5 a token) against a price saved of
    # 0.01 x 0.5 = 0.005: it stays (and 700 - 500 < 250 apart: no gain halving).
    assert t.spacing == 500
    assert t.loss_doubling == pytest.approx(WINDOW * 500 * DECAY)
    # Then only anchored hits for long enough: the old loss fades until the price wins.
    steps = 0
    while t.spacing == 500:
        for _ in range(WINDOW):
            t.observe(400, 400, 1000)
        steps += 1
    assert t.spacing == 1000 and steps > 1
    t.check_integrity()


def test_price_holds_a_small_gain_back() -> None:
    t = _tuner()
    # One request in a window of 100 branches at 900 over a floor point at 0; the
    # rest hit half their prompt: gain 500 / 100,000 = 0.005, price 1.5 x 0.01 x ~0.5.
    t.observe(900, 0, 1000)
    for _ in range(WINDOW - 1):
        t.observe(500, 500, 1000)
    assert t.spacing == 1000


def test_integrity_catches_a_corrupt_tuner() -> None:
    t = _tuner()
    t.level = 3
    with pytest.raises(AssertionError, match="level out of bounds"):
        t.check_integrity()
    t = _tuner()
    t.levels[1] = 490
    with pytest.raises(AssertionError, match="levels"):
        t.check_integrity()
    t = _tuner()
    t.count = WINDOW
    with pytest.raises(AssertionError, match="a decision was skipped"):
        t.check_integrity()


def test_the_manager_keeps_the_tuners_spacing() -> None:
    # Full + Mamba, block size 4: the cost-based floor is 128 tokens, levels 128, 64, 32.
    kv = KVCacheManager(config(64, FULL, MAMBA), 512, cache_policy="hybrid")
    tuner = kv.policy.floor_tuner
    assert tuner is not None and tuner.levels == [128, 64, 32]
    tuner.level = 1  # as if it had halved
    req = Request("a", list(range(300)))
    blocks, hit = kv.get_computed_blocks(req)
    assert kv.policy.kept_points(kv._admission_of(req, hit, blocks)) == (64, 128, 192, 256, 300)
    assert kv.policy.floor_tokens == 64 and tuner.count == 1
    kv.coordinator.check_integrity()
    kv.policy.floor_tokens = 128
    with pytest.raises(AssertionError, match="the floor is the tuner's"):
        kv.coordinator.check_integrity()
    # A floor set by hand, lru and layouts without a floor have no tuner.
    assert (
        KVCacheManager(
            config(64, FULL, MAMBA), 512, cache_policy="hybrid", hybrid_floor_tokens=90
        ).policy.floor_tuner
        is None
    )
    # lru, and hybrid over full attention alone (which decides as lru): no policy state
    assert not KVCacheManager(config(64, FULL, MAMBA), 512).policy.keeps_points
    assert not KVCacheManager(config(64, FULL), 512, cache_policy="hybrid").policy.keeps_points
    off = KVCacheManager(
        config(64, FULL, MAMBA), 512, cache_policy="hybrid", hybrid_tuning={"learn_floor": False}
    )
    assert off.policy.floor_tuner is None and off.policy.floor_tokens == 128  # fixed at its start


def test_the_tuning_sets_the_window_the_decay_and_the_densest_level() -> None:
    """The tuner decides every ``floor_window`` admissions, keeps ``floor_decay``
    of its sums, and goes no denser than ``base // floor_min_divisor``."""
    tuning = T.replace(floor_window=3, floor_decay=0.5, floor_min_divisor=2)
    t = FloorTuner(1000, 50.0, 10, tuning)
    assert t.levels == [1000, 500]
    for _ in range(2):
        t.observe(0, 0, 100)
    assert t.count == 2 and t.prompt_tokens == 200
    t.observe(0, 0, 100)
    assert t.count == 0 and t.prompt_tokens == pytest.approx(150)
    t.check_integrity()


def test_going_back_weighs_the_points_a_level_would_give_not_only_those_it_served() -> None:
    # Just after a halving, earlier prompts have no point every 500: a branch at 900
    # hits 0, yet the new level would give it 500 once its points exist, so that
    # counts against going back (counting only served hits sent Jamba straight back).
    t = _tuner()
    t.level = 1
    t.observe(900, 0, 1000)
    assert t.loss_doubling == 500
    # A hit above the denser point: a point not on the floor served it; no evidence.
    t.observe(900, 800, 1000)
    # A hit below the sparser level's point: that prefix's floor was evicted; none.
    t.observe(2300, 1000, 1000)
    assert t.loss_doubling == 500
    # At the sparsest level there is nothing to go back to.
    t = _tuner()
    t.observe(900, 0, 1000)
    assert t.loss_doubling == 0


def _window(t: FloorTuner, obs: list[tuple[int, int]]) -> int:
    """One decision's worth of admissions (prompts of 1,000 tokens): ``obs`` then
    requests that resume where an earlier prompt ended (match = hit = 500)."""
    for m, h in obs:
        t.observe(m, h, 1000)
    for _ in range(WINDOW - len(obs)):
        t.observe(500, 500, 1000)
    return t.spacing


def test_halving_is_priced_by_the_next_level_not_the_last() -> None:
    # Gain 3 x 500 / 100,000 = 0.015 a token; hit rate 48,500 / 100,000. Halving to
    # 500 moves 10/500 - 10/1000 = 0.01 of memory: 1.5 x 0.01 x 0.485 = 0.0073, under
    # the gain. Priced at 250 (0.03: 0.0218) it would not halve.
    assert _window(_tuner(), [(900, 0)] * 3) == 500


def test_halving_again_and_staying_at_the_densest_level() -> None:
    t = _tuner()
    assert _window(t, [(900, 0)] * 50) == 500
    # At 500, a branch at 999 over a hit at 500 would get 750 from a point every 250.
    assert _window(t, [(999, 500)] * 50) == 250
    # The densest level takes no more evidence of halving, and never goes below it.
    assert t.gain_halving > 0  # what is left of the last window's, decayed
    before = t.gain_halving
    assert _window(t, [(999, 750)] * 50) == 250
    assert t.gain_halving == pytest.approx(before * DECAY)
    t.check_integrity()


def test_going_back_from_the_densest_level_is_priced_against_the_next_sparser() -> None:
    t = _tuner()
    t.level = 2  # every 250
    # Each branch at 750 hit 750: every 500 would give 500, a loss of 250. Loss
    # 750 / 100,000 = 0.0075 a token against the memory saved going back to 500,
    # (10/250 - 10/500) x 0.5075 / 1.5 = 0.0068: it stays. Priced against 1,000
    # (0.03 x 0.5075 / 1.5 = 0.0102) it would go back.
    assert _window(t, [(750, 750)] * 3) == 250


def test_no_hits_no_price_no_move() -> None:
    # Nothing hits: memory costs no hits, and no evidence moves the spacing either way.
    for level in (0, 1):
        t = _tuner()
        t.level = level
        for _ in range(WINDOW):
            t.observe(0, 0, 1000)
        assert t.level == level


def test_a_hit_on_the_floor_point_below_the_branch_is_evidence() -> None:
    # A branch at 900 hit 0, the floor point below it: a point every 500 gives 500.
    t = _tuner()
    t.observe(900, 0, 1000)
    assert t.gain_halving == 500
    # One whose floor point (2,000) had been evicted says nothing about a denser one.
    t.observe(2300, 1000, 1000)
    # A hit at the branch itself: no point below it would do better.
    t.observe(700, 700, 1000)
    assert t.gain_halving == 500
    # At the middle level, evidence for the densest: a point every 250 gives 750.
    t.level = 1
    t.observe(999, 500, 1000)
    assert t.gain_halving == 750
