"""Returning prompts (``hybridkv/policy/returning.py``), by hand.

``SeenPrefixes`` on its own, then the manager: a request whose prompt
continues what the cache held has every unit valued ``2 ** (bonus / weight)``
higher when freed, exact classes and keys; a first turn, a request sharing
only a header, a resumed request and ``lru`` are not.
"""

from __future__ import annotations

import math

import pytest
from factories import config
from test_hybrid_policy import FULL, SWA, manager, run

from hybridkv import KVCacheManager, Request
from hybridkv.core.free_queue import FreeKVCacheBlockQueue
from hybridkv.policy.cost_aware import CostAwareEvictionPolicy
from hybridkv.policy.options import RETURN_GRADE_NAMES
from hybridkv.policy.returning import SeenPrefixes, sample_keys
from hybridkv.policy.reuse_horizon import ReleaseTimes
from hybridkv.policy.tuning import DEFAULT_TUNING as T

MAX_TURN, SAMPLE_BLOCKS, SEEN_PER_BLOCK = T.max_turn, T.sample_blocks, T.seen_per_block


def chain(text: str) -> list[bytes]:
    """Chained block hashes, one block per letter: each block's hash is the
    whole prefix it ends (as ``hybridkv.core.hashing``'s determine theirs)."""
    return [text[: i + 1].encode() for i in range(len(text))]


def test_a_prompt_is_returning_when_half_of_it_was_seen_from_its_start() -> None:
    seen = SeenPrefixes(capacity=8, stride=1)
    seen.record(chain("abc"))
    # 4 blocks of 4 tokens, 16 tokens: half is 8 tokens, 2 blocks: a, ab seen.
    assert seen.returning(chain("abxy"), 4, 16)
    # 18 tokens: half is 9, 3 blocks: abx was not seen.
    assert not seen.returning(chain("abxy"), 4, 18)
    # The same blocks after another start are other prefixes: not seen.
    assert not seen.returning(chain("xabc"), 4, 16)
    # A prompt with fewer whole blocks than half of it needs (a short one) is not.
    assert not seen.returning([], 4, 3)
    assert seen.returning(chain("a"), 4, 7)  # 7 tokens: half needs 1 block


def test_one_block_in_stride_is_remembered_and_looked_up() -> None:
    """Stride 3: ``record`` keeps the hashes ending blocks 3, 6... (indices
    2, 5...), and a prompt is returning when the sample at or past half of
    it was seen: half rounded up to a whole run of 3 blocks."""
    seen = SeenPrefixes(capacity=8, stride=3)
    seen.record(chain("abcdefg"))  # 7 blocks: samples abc, abcdef
    assert len(seen) == 2
    # 8 blocks of 1 token: half is 4 blocks, rounded up to 6: abcdef seen.
    assert seen.returning(chain("abcdefxy"), 1, 8)
    # Half is 2 blocks, rounded up to 3: abc seen, although only 2 are needed.
    assert seen.returning(chain("abxy"), 1, 4) == 0  # ab + x: abx, not abc
    assert seen.returning(chain("abcy"), 1, 4)
    # 14 tokens: half is 7 blocks, rounded up to 9; 8 whole blocks: too short.
    assert not seen.returning(chain("abcdefgh"), 1, 14)
    # With 9 whole blocks the sample abcdefghi decides: never recorded (the
    # 7 blocks recorded end before it), so not returning.
    assert not seen.returning(chain("abcdefghi"), 1, 14)


def test_turns_are_remembered_with_the_samples_when_kept() -> None:
    """With turns kept, a returning prompt's turn is 1 + the one recorded with
    the sample that decided it (the newest record of it), at most ``MAX_TURN``;
    without, every returning prompt is turn 1."""
    seen = SeenPrefixes(capacity=8, stride=1, turns=True)
    seen.record(chain("abc"))  # a first turn: turn 0
    assert seen.returning(chain("abxy"), 4, 16) == 1
    seen.record(chain("abcd"), turn=1)  # its next turn renews a, ab, abc
    assert seen.returning(chain("abxy"), 4, 16) == 2
    assert seen.returning(chain("abcdxyzw"), 4, 32) == 2  # decided by abcd
    seen.record(chain("abcde"), turn=MAX_TURN)
    assert seen.returning(chain("abcdexyzwv"), 4, 40) == MAX_TURN
    assert seen.returning(chain("xy"), 4, 8) == 0
    seen.check_integrity()
    flat = SeenPrefixes(capacity=8, stride=1)
    flat.record(chain("abcd"), turn=5)
    assert flat.returning(chain("abxy"), 4, 16) == 1
    flat.check_integrity()


def test_a_generation_of_turns_turns_over_as_one_of_samples() -> None:
    seen = SeenPrefixes(capacity=4, stride=1, turns=True)
    seen.record(chain("abc"), turn=3)  # 3 > 2: the newer generation turns over
    assert seen._new == {} and len(seen._old) == 3
    assert seen.returning(chain("abxy"), 4, 16) == 4  # found in the older one
    seen.record(chain("ab"), turn=0)  # the newer one wins
    assert seen.returning(chain("abxy"), 4, 16) == 1
    seen.check_integrity()


def test_the_manager_samples_every_sample_blocks_blocks() -> None:
    """The coordinator's memory keeps ``SEEN_PER_BLOCK`` blocks of history
    per pool block, one sample in ``SAMPLE_BLOCKS``."""
    kv = manager(FULL, SWA, num_blocks=80, weight=1.0, bonus=2.0)
    seen = kv.policy.seen
    assert seen is not None and seen.stride == SAMPLE_BLOCKS
    assert seen.capacity == SEEN_PER_BLOCK * 80 // SAMPLE_BLOCKS


def test_the_oldest_hashes_are_forgotten_beyond_capacity() -> None:
    """Capacity 4: two generations of at most 2. A generation that grows past
    2 becomes the older one, and the older one before it is forgotten."""
    seen = SeenPrefixes(capacity=4, stride=1)
    seen.record([b"a", b"b", b"c"])  # past 2 at once: older = {a, b, c}
    assert len(seen) == 3
    seen.record([b"a"])  # renewed: newer = {a}
    seen.record([b"d"])  # newer = {a, d}
    assert seen.returning([b"b"], 1, 1)  # still in the older generation
    seen.record([b"e"])  # newer = {a, d, e}: older; b and c forgotten
    assert len(seen) == 3
    assert seen.returning([b"a"], 1, 1)
    assert not seen.returning([b"b"], 1, 1)
    assert not seen.returning([b"c"], 1, 1)
    assert seen.returning([b"d", b"e"], 1, 2)
    seen.check_integrity()
    seen.record([b"f"])
    assert seen.returning([b"f"], 1, 1)  # in the newer generation
    assert seen.returning([b"e"], 1, 1)  # in the older one
    seen.check_integrity()


@pytest.mark.parametrize(
    ("capacity", "share", "stride"),
    [(-1, 0.5, 1), (4, 0.0, 1), (4, 1.5, 1), (4, 0.5, 0), (4, 0.5, True), (4, 0.5, 2.0)],
)
def test_bad_arguments(capacity: int, share: float, stride: int) -> None:
    with pytest.raises(ValueError, match=r"capacity|share|stride"):
        SeenPrefixes(capacity, share, stride)


@pytest.mark.parametrize("bonus", [-1.0, float("inf"), True, "2"])
def test_the_manager_rejects_a_bad_bonus(bonus: object) -> None:
    with pytest.raises(ValueError, match="hybrid_return_bonus"):
        manager(FULL, SWA, bonus=bonus)  # type: ignore[arg-type]


@pytest.mark.parametrize("grade", ["steep", "Turn", 1, None, ["turn"]])
def test_the_manager_rejects_a_bad_grade(grade: object) -> None:
    with pytest.raises(
        ValueError, match=r"^hybrid_return_grade must be one of flat, turn, log-turn"
    ):
        KVCacheManager(config(64, FULL, SWA), 256, hybrid_return_grade=grade)  # type: ignore[arg-type]


def keyed(kv: KVCacheManager) -> list[tuple[int, int, float]]:
    return [
        (b.block_id, b.free_class, b.evict_key)
        for b in kv.block_pool.policy
        if b.free_class is not None
    ]


def test_a_returning_request_is_valued_bonus_turnovers_higher_by_hand() -> None:
    """``test_freed_units_are_valued_by_hand`` with a return bonus of 2 pool
    turnovers at weight 1: a factor of 2 ** 2 = 4 on every unit of B.

    A (32 tokens, 8 blocks) is a first turn: nothing was seen, its unit 32 is
    worth 3.2 as before (class 3). B = A's 32 tokens + 4: its first 5 blocks
    (half of 36 tokens is 18, 5 blocks of 4) were A's, so B is returning.
    Unit 36: 2.0 x 4 = 8.0, class floor(2 log2 8) = 6; unit 32, released
    again by B: 3.2 x 4 = 12.8, class floor(2 log2 12.8) = 7. Keys are
    clock / 63 + class / 2 as before.
    """
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    assert kv.policy.return_factor == 4.0
    run(kv, "a", list(range(32)))
    a_units = [8, 16, 7, 15, 6, 5, 4, 3, 2, 1]
    assert keyed(kv) == [(i, 3, pytest.approx(k / 63 + 1.5)) for k, i in enumerate(a_units, 1)]
    assert run(kv, "b", [*range(32), *range(100, 104)]) == 32
    b_units = [(14, 6), (13, 6)] + [(i, 7) for i in a_units]
    assert keyed(kv) == [
        (i, cls, pytest.approx(clock / 63 + cls / 2))
        for clock, (i, cls) in enumerate(b_units, len(a_units) + 1)
    ]


def graded(grade: str) -> KVCacheManager:
    return KVCacheManager(
        config(64, FULL, SWA),
        256,
        cache_policy="hybrid",
        hybrid_value_weight=1.0,
        hybrid_return_bonus=2.0,
        hybrid_return_grade=grade,
    )


def three_turns(kv: KVCacheManager) -> list[tuple[int, int, float]]:
    """A (32 tokens), B = A + 4 tokens, C = B + 4 tokens, one after the other;
    each request's turn checked; the keyed free blocks after C."""
    run(kv, "a", list(range(32)))
    turns = []
    for rid, tokens in (
        ("b", [*range(32), *range(100, 104)]),
        ("c", [*range(32), *range(100, 104), *range(200, 204)]),
    ):
        req = Request(rid, tokens)
        blocks, hit = kv.get_computed_blocks(req)
        assert kv.allocate_slots(req, len(tokens) - hit, hit, blocks) is not None
        turns.append((req.returning, kv.policy._returning[rid]))
        req.num_computed_tokens = len(tokens)
        kv.free(req)
        kv.check_integrity()
    flat = kv.policy.seen is not None and not kv.policy.seen.turns
    assert turns == [(1, 1), (1, 1) if flat else (2, 2)]
    return keyed(kv)


#: C's release under the flat grade (bonus 2 at weight 1: every unit 4x): its
#: last 13 free blocks, (block id, class); the 7 before are A's and B's.
C_FLAT = [(19, 6), (20, 6), (16, 6), (17, 7), (18, 7), *((i, 7) for i in range(8, 0, -1))]


@pytest.mark.parametrize("grade", sorted(RETURN_GRADE_NAMES))
def test_the_bonus_grows_with_the_turn_by_hand(grade: str) -> None:
    """B continues A: turn 1, valued 4x (``return_factor``) under every grade.
    C's deciding sample (the block ending token 32) was last recorded by B, of
    turn 1, so C is turn 2 where turns are kept and is worth ``4 ** grade(2)``:
    16 with ``turn`` (every class of C's release 4 half-octaves above the flat
    grade's), ``4 ** log2(3)`` with ``log-turn`` (2 log2 of 4 ** (log2(3) - 1)
    = 2.34 half-octaves: 2 or 3 classes above, by where each value sits in its
    class); 4 with ``flat`` (no turns kept: C is turn 1). Everything released
    before C is the same."""
    flat = three_turns(graded("flat"))
    kv = graded(grade)
    got = three_turns(kv)
    assert [(i, c) for i, c, _ in flat[-13:]] == C_FLAT
    assert got[:-13] == flat[:-13]
    assert [i for i, _, _ in got] == [i for i, _, _ in flat]
    shift = [c - f for (_, c, _), (_, f, _) in zip(got[-13:], flat[-13:], strict=True)]
    factor = {"flat": 4.0, "turn": 16.0, "log-turn": 4.0 ** math.log2(3)}[grade]
    assert kv.policy.return_value(2) == pytest.approx(factor)
    assert kv.policy.return_value(0) == 1.0
    if grade == "flat":
        assert shift == [0] * 13
    elif grade == "turn":
        assert shift == [4] * 13
    else:
        # C's unit 40 (classes 6 flat) lands 2 classes up, the rest 3.
        assert shift == [2] * 3 + [3] * 10


def test_a_shared_header_alone_is_not_returning_by_hand() -> None:
    """C shares A's first 8 tokens (2 blocks) of its 36: half needs 5 blocks,
    so C is a first turn and keeps the plain values (its own unit 36 would
    be class 6 if it were returning)."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    run(kv, "a", list(range(32)))
    c = Request("c", [*range(8), *range(200, 228)])
    blocks, hit = kv.get_computed_blocks(c)
    assert kv.allocate_slots(c, 36 - hit, hit, blocks) is not None
    assert c.returning == 0
    c.num_computed_tokens = 36
    kv.free(c)
    assert max(cls for _, cls, _ in keyed(kv)) == 3


def test_a_resumed_request_keeps_its_first_answer() -> None:
    """D is a first turn; preempted and resumed, its own blocks fill the
    memory of what was seen, yet it stays not returning (and a returning
    request stays returning)."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    d = Request("d", list(range(300, 340)))
    blocks, hit = kv.get_computed_blocks(d)
    assert kv.allocate_slots(d, 40, hit, blocks) is not None
    d.num_computed_tokens = 40
    assert d.returning == 0
    kv.free(d)  # preempted
    d.num_preemptions += 1
    d.num_computed_tokens = 0
    assert kv.policy._returning_turn(d.live_block_hashes, d.num_prompt_tokens)
    blocks, hit = kv.get_computed_blocks(d)
    assert hit == 36
    assert kv.allocate_slots(d, 40 - hit, hit, blocks) is not None
    assert d.returning == 0
    assert "d" not in kv.policy._returning
    kv.check_integrity()


@pytest.mark.parametrize(
    ("policy", "bonus", "weight"), [("lru", 2.0, 1.0), ("hybrid", 0.0, 1.0), ("hybrid", 2.0, 0.0)]
)
def test_off_under_lru_without_bonus_or_ranking(policy: str, bonus: float, weight: float) -> None:
    """Nothing is remembered or marked under ``lru``, with bonus 0, or when
    the free set ranks by recency only (weight 0: a factor would change nothing)."""
    kv = manager(FULL, SWA, policy=policy, weight=weight, bonus=bonus)
    assert getattr(kv.policy, "seen", None) is None
    assert getattr(kv.policy, "return_factor", 1.0) == 1.0
    run(kv, "a", list(range(32)))
    b = Request("b", [*range(32), *range(100, 104)])
    blocks, hit = kv.get_computed_blocks(b)
    assert kv.allocate_slots(b, 36 - hit, hit, blocks) is not None
    assert b.returning is None


def test_a_bonus_under_one_turnover_still_counts() -> None:
    """Bonus 0.5 at weight 2: a factor of 2 ** 0.25."""
    kv = manager(FULL, SWA, weight=2.0, bonus=0.5)
    assert kv.policy.seen is not None
    assert kv.policy.return_factor == pytest.approx(2**0.25)


def test_no_memory_when_the_free_set_is_overridden() -> None:
    """``eviction_policy`` overrides the ordering: under ``lru`` with a
    cost-aware free set, or under ``hybrid`` with a recency-only one, there is
    no returning rule to apply (the memory would only cost)."""
    cfg = config(64, FULL, SWA)
    lru = KVCacheManager(cfg, 256, cache_policy="lru", eviction_policy=CostAwareEvictionPolicy)
    assert not lru.policy.keeps_points
    plain = KVCacheManager(cfg, 256, cache_policy="hybrid", eviction_policy=FreeKVCacheBlockQueue)
    assert plain.policy.seen is None and plain.policy.return_factor == 1.0


def test_a_free_without_hashes_records_nothing() -> None:
    """``KVCacheCoordinator.free`` without the request's hashes (a caller that
    drives the coordinator itself) releases as usual and remembers nothing."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    a = Request("a", list(range(32)))
    blocks, hit = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 32, hit, blocks) is not None
    assert kv.coordinator.free("a") is True
    assert len(kv.policy.seen) == 0  # type: ignore[arg-type]
    kv.coordinator.check_integrity()


def test_only_an_admission_with_a_hit_lookup_decides() -> None:
    """A request allocated without ``new_computed_blocks`` (no hit lookup, so
    no kept points either) is never judged returning, even if it continues a
    prompt the cache held."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    run(kv, "a", list(range(32)))
    b = Request("b", [*range(32), *range(100, 104)])
    assert kv.allocate_slots(b, 36) is not None
    assert b.returning is None
    assert "b" not in kv.policy._returning


def test_capacity_zero_and_share_one_are_valid() -> None:
    nothing = SeenPrefixes(0, stride=1)
    nothing.record([b"a"])
    assert len(nothing) == 0
    assert not nothing.returning([b"a"], 1, 1)
    whole = SeenPrefixes(4, share=1.0, stride=1)
    whole.record(chain("ab"))
    assert whole.returning(chain("ab"), 4, 8)
    assert not whole.returning(chain("ab"), 4, 9)  # 9 tokens need 3 blocks


def test_both_learners_record_one_sampling_as_their_own() -> None:
    """The policy samples a freed request once (``sample_keys``: the blocks
    ending each run of ``stride``, among the first ``num_blocks``) and hands the
    samples to ``SeenPrefixes`` and ``ReleaseTimes`` (``record_samples``)."""
    hashes = chain("abcdefg")
    assert sample_keys(hashes, None, 3) == [hash(hashes[2]), hash(hashes[5])]
    samples = sample_keys(hashes, 5, 3)  # "abcdef" (index 5) is past 5 blocks
    assert samples == [hash(hashes[2])]
    seen = SeenPrefixes(100, share=1.0, stride=3, turns=True)
    seen.record_samples(samples, turn=2)
    assert seen.returning(chain("abcx"), 1, 3) == 3  # "abc" seen with turn 2
    assert seen.returning(chain("abcdefx"), 1, 6) == 0  # "abcdef" not sampled
    times = ReleaseTimes(100, 3)
    times.record_samples(samples, 7)
    assert times.gap(chain("abcdefgh"), 9) == 2  # the deepest recorded: "abc"
    seen.check_integrity()
    times.check_integrity()
