"""The return bonus graded by measured continuation (``ContinuationRates``), by hand.

A freed prompt is noted by the sample ending its first half; a later prompt
holding that sample continues it; one that ``horizon`` later noted prompts
pass without a continuation expires. The bonus's share is
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
        "horizon": 64,
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
    assert len(r) == 2
    assert r.rate(False) is r.rate(True) is None  # nothing resolved yet
    # A prompt sharing only "a" (a header, under half of "abcd") continues nothing.
    assert r.observe(chain("aqqq")) is None
    # "abcdef" holds "ab": it continues the first prompt, credited once.
    assert r.observe(chain("abcdef")) is False
    assert r.observe(chain("abcdef")) is None
    assert (r.rate(False), r.rate(True)) == (1.0, None)
    assert r.observe(chain("wxy")) is True
    assert (r.rate(False), r.rate(True)) == (1.0, 1.0)
    assert len(r) == 0
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
    noted; a 3-block prompt (half rounded up to 4 > 3) is not noted at all."""
    r = rates(stride=4)
    r.record(chain("abc"), 1, 3, returning=False)
    assert len(r) == 0
    r.record(chain("abcdef"), 1, 6, returning=False)
    assert len(r) == 1
    assert r.observe(chain("abcdefghij")) is False


def test_a_prompt_not_continued_within_the_horizon_expires() -> None:
    """Horizon 2: the third noted prompt pushes the first out, not continued;
    a continuation that comes after that is not credited."""
    r = rates(horizon=2)
    for i in range(3):
        r.record(chain(f"p{i}zz"), 1, 4, returning=False)
    assert len(r) == 2
    assert r.rate(False) == 0.0  # p0 expired: 0 of 1 resolved
    assert r.observe(chain("p0zzz")) is None
    assert r.observe(chain("p2zzz")) is False
    assert r.rate(False) == 0.5  # p2 continued, p0 expired
    r.check_integrity()


def test_counts_are_halved_every_window() -> None:
    r = rates(window=4, horizon=1)
    r.record(chain("a0zz"), 1, 4, returning=False)
    assert r.observe(chain("a0zzz")) is False  # 1 continued
    for i in range(1, 4):  # 3 more noted (the 4th: halved), 2 of them expire
        r.record(chain(f"a{i}zz"), 1, 4, returning=False)
    assert r.rate(False) == pytest.approx(0.5 / 1.5)  # halved: 0.5 continued, 1 expired
    r.record(chain("a4zz"), 1, 4, returning=False)  # a3 expires: 0.5 of 2.5
    assert r.rate(False) == pytest.approx(0.2)


def resolve(r: ContinuationRates, cls: bool, continued: int, expired: int) -> None:
    """With horizon 1: ``expired`` prompts of class ``cls`` noted and never
    continued (each expires when the next is noted), then ``continued`` noted
    and continued at once (the first of them expires the last expired one)."""
    for i in range(expired):
        r.record(chain(f"{int(cls)}x{i:02d}zzzz"), 1, 8, returning=cls)  # noted by "1x00"
    for i in range(continued):
        prompt = chain(f"{int(cls)}c{i:02d}zzzz")
        r.record(prompt, 1, 8, returning=cls)
        assert r.observe([*prompt, b"more"]) is cls


@pytest.mark.parametrize(
    ("first", "returning", "share"),
    [
        ((9, 1), (8, 2), 0.0),  # returning continued less: no bonus
        ((5, 5), (5, 5), 0.0),  # as often: none
        ((2, 8), (4, 6), 1.0),  # twice as often (full_ratio 2): all of it
        ((2, 8), (9, 1), 1.0),  # more: all of it
        ((4, 6), (5, 5), math.log2(5 / 4)),  # in between: log_2 of the ratio
        ((0, 10), (1, 9), 1.0),  # first prompts never continued
    ],
)
def test_the_grade_by_hand(
    first: tuple[int, int], returning: tuple[int, int], share: float
) -> None:
    r = rates(horizon=1)
    resolve(r, False, *first)
    resolve(r, True, *returning)
    assert len(r) == 0
    assert r.rate(False) == first[0] / sum(first)
    assert r.rate(True) == returning[0] / sum(returning)
    assert r.grade() == pytest.approx(share)


def test_before_min_observed_the_last_grade_holds() -> None:
    r = rates(min_observed=3, horizon=1)
    resolve(r, False, 3, 0)  # first prompts: 3 of 3 continued
    for i in range(3):  # returning ones expire: r0 at r1, r1 at r2
        r.record(chain(f"r{i}zzzz"), 1, 6, returning=True)
    assert r.rate(True) is None  # 2 resolved
    assert r.grade() == 1.0  # the prior
    r.record(chain("r3zzzz"), 1, 6, returning=True)  # r2 expires: 3 resolved
    assert r.rate(True) == 0.0 and r.grade() == 0.0
    # First prompts become rare: halving drops them under the minimum, the grade holds.
    r.window = 1
    r.record(chain("r4zzzz"), 1, 6, returning=True)
    assert r.rate(False) is None and r.grade() == 0.0


@pytest.mark.parametrize("kw", [{"horizon": 0}, {"window": 0}, {"stride": 0}, {"full_ratio": 1.0}])
def test_bad_arguments(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"horizon|window|stride|full_ratio"):
        rates(**kw)


def test_the_policy_scales_the_bonus_by_the_measured_grade() -> None:
    """With continuation measured where returning prompts are continued no
    more often than first ones, a returning request's units get no bonus; off,
    the flat bonus stays."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    policy = kv.policy
    assert policy.rates is not None and policy.return_factor == 4.0
    assert policy.return_value(1) == 4.0  # the prior: the whole bonus
    measured = policy.rates
    for i in range(T.learn_min_observed):
        for cls in (False, True):
            prompt = chain(f"{int(cls)}{i:03d}" + "z" * 60)
            measured.record(prompt, 4, 4 * len(prompt), returning=cls)
            assert measured.observe([*prompt, b"more"]) is cls
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


def test_num_blocks_notes_as_the_prompt_cut_there() -> None:
    """``record(hashes, ..., num_blocks=n)`` notes what ``record(hashes[:n], ...)``
    does (the policy passes a freed request's cached blocks without a copy):
    a sample past ``n`` is not noted, one within is."""
    cut, whole = rates(stride=2), rates(stride=2)
    prompt = chain("abcdefgh")
    for n, tokens in ((3, 8), (4, 6), (8, 16)):  # half of 8 tokens: 4 blocks, past 3
        cut.record(prompt[:n], 1, tokens, returning=False)
        whole.record(prompt, 1, tokens, returning=False, num_blocks=n)
        assert len(cut) == len(whole)
    assert len(whole) == 2
    for other in (cut, whole):
        assert other.observe(chain("abcdefghi")) is False  # "abcdefgh"
        assert other.observe(chain("abcdx")) is False  # "abcd"
    assert cut.rate(False) == whole.rate(False)
