"""The return bonus graded by measured continuation (``ContinuationRates``), by hand.

A freed prompt is noted by the sample ending its first half; a later prompt
holding that sample continues it. The bonus's share is
``clamp(log_r(returning rate / first rate), 0, 1)``: the policy's
``return_value`` follows it, and ``learn_return_rates=off`` keeps the flat bonus.
"""

from __future__ import annotations

import math

import pytest
from factories import config
from test_hybrid_policy import FULL, SWA, manager
from test_returning import chain

from hybridkv import KVCacheManager
from hybridkv.policy.options import HybridOptions
from hybridkv.policy.returning import ContinuationRates
from hybridkv.policy.tuning import DEFAULT_TUNING as T


def rates(**kw: object) -> ContinuationRates:
    """Stride 1, share 0.5, no minimum, a window too large to halve, full at 2x."""
    args: dict[str, object] = {
        "capacity": 64,
        "window": 1000,
        "min_observed": 0,
        "share": 0.5,
        "stride": 1,
        "full_ratio": 2.0,
    }
    args.update(kw)
    return ContinuationRates(**args)  # type: ignore[arg-type]


def test_a_continuation_is_credited_to_the_class_of_the_prompt_it_continues() -> None:
    r = rates()
    r.record(chain("abcd"), 1, 4, returning=False)  # noted by its 2nd block, "ab"
    r.record(chain("wxyz"), 1, 4, returning=True)  # noted by "wx"
    assert r.rate(False) == r.rate(True) == 0.0
    # A prompt sharing only "a" (a header, under half of "abcd") continues nothing.
    assert r.observe(chain("aqqq")) is None
    # "abcdef" holds "ab": it continues the first prompt, credited once.
    assert r.observe(chain("abcdef")) is False
    assert r.observe(chain("abcdef")) is None
    assert (r.rate(False), r.rate(True)) == (1.0, 0.0)
    assert r.observe(chain("wxy")) is True
    assert (r.rate(False), r.rate(True)) == (1.0, 1.0)
    r.check_integrity()


def test_the_deepest_noted_prompt_is_credited() -> None:
    """Two turns of one conversation are noted; the third turn holds both
    samples and credits the deeper one (its previous turn) only."""
    r = rates()
    r.record(chain("ab"), 1, 2, returning=False)  # noted by "a"
    r.record(chain("abcdef"), 1, 6, returning=True)  # noted by "abc"
    assert r.observe(chain("abcdefgh")) is True
    assert r.observe(chain("abcdefgh")) is False  # "a" still waits: the next deepest


def test_a_prompt_shorter_than_its_sample_run_is_not_noted() -> None:
    """Stride 4: a 6-block prompt's half (3 blocks) rounds up to 4 blocks,
    noted; a 3-block prompt (half rounded up to 4 > 3) is not counted at all."""
    r = rates(stride=4)
    r.record(chain("abc"), 1, 3, returning=False)
    assert r.rate(False) is None  # nothing noted
    r.record(chain("abcdef"), 1, 6, returning=False)
    assert r.rate(False) == 0.0 and len(r) == 1
    assert r.observe(chain("abcdefghij")) is False


@pytest.mark.parametrize(
    ("first", "returning", "share"),
    [
        ((9, 10), (8, 10), 0.0),  # returning continued less: no bonus
        ((5, 10), (5, 10), 0.0),  # as often: none
        ((2, 10), (4, 10), 1.0),  # twice as often (full_ratio 2): all of it
        ((2, 10), (9, 10), 1.0),  # more: all of it
        ((4, 10), (5, 10), math.log2(5 / 4)),  # in between: log_2 of the ratio
        ((0, 10), (1, 10), 1.0),  # first prompts never continued
    ],
)
def test_the_grade_by_hand(
    first: tuple[int, int], returning: tuple[int, int], share: float
) -> None:
    r = rates()
    for cls, (cont, noted) in ((False, first), (True, returning)):
        for i in range(noted):
            prompt = chain(f"{int(cls)}{i:02d}zz")  # 6 blocks, noted by the 3rd
            r.record(prompt, 1, 6, returning=cls)
            if i < cont:
                assert r.observe([*prompt, b"more"]) is cls
    assert r.grade() == pytest.approx(share)


def test_before_min_observed_the_whole_bonus_holds() -> None:
    r = rates(min_observed=3)
    for i in range(3):
        r.record(chain(f"f{i}zz"), 1, 4, returning=False)
    r.record(chain("r0zz"), 1, 4, returning=True)
    r.record(chain("r1zz"), 1, 4, returning=True)
    assert r.rate(True) is None
    assert r.grade() == 1.0  # returning never continued, but only 2 noted
    r.record(chain("r2zz"), 1, 4, returning=True)
    assert r.grade() == 0.0


def test_counts_are_halved_every_window_and_pending_prompts_are_bounded() -> None:
    r = rates(window=4, capacity=2)
    for i in range(3):
        r.record(chain(f"p{i}zz"), 1, 4, returning=False)
    assert len(r) == 2  # the oldest ("p0") was forgotten
    assert r.observe(chain("p0zzz")) is None
    assert r.observe(chain("p2zzz")) is False
    assert r.rate(False) == 1 / 3
    r.record(chain("p3zz"), 1, 4, returning=False)  # the 4th noted: 0.5 of 2 after halving
    assert r.rate(False) == 0.25
    r.check_integrity()


@pytest.mark.parametrize("kw", [{"capacity": 0}, {"window": 0}, {"stride": 0}, {"full_ratio": 1.0}])
def test_bad_arguments(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"capacity|window|stride|full_ratio"):
        rates(**kw)


def test_the_policy_scales_the_bonus_by_the_measured_grade() -> None:
    """With continuation measured where returning prompts are continued less,
    a returning request's units get no bonus; off, the flat bonus stays."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    policy = kv.policy
    assert policy.rates is not None and policy.return_factor == 4.0
    assert policy.return_value(1) == 4.0  # the prior: the whole bonus
    measured = policy.rates
    for i in range(T.learn_min_observed):
        for cls in (False, True):
            prompt = chain(f"{int(cls)}{i:03d}" + "z" * 60)
            measured.record(prompt, 4, 4 * len(prompt), returning=cls)
            if not cls:
                measured.observe([*prompt, b"more"])
    assert measured.grade() == 0.0
    assert policy.return_value(1) == 1.0
    assert policy.return_value(0) == 1.0
    off = KVCacheManager(
        config(64, FULL, SWA),
        256,
        cache_policy="hybrid",
        hybrid_value_weight=1.0,
        hybrid_return_bonus=2.0,
        hybrid_tuning={"learn_return_rates": False},
    )
    assert off.policy.seen is not None
    assert off.policy.rates is None and off.policy.return_value(1) == 4.0
    assert HybridOptions().tuning.learn_return_rates
