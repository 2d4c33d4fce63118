"""Returning prompts (``hybridkv/managers/returning.py``), by hand.

``SeenPrefixes`` on its own, then the manager: a request whose prompt
continues what the cache held has every unit valued ``2 ** (bonus / weight)``
higher when freed, exact classes and keys; a first turn, a request sharing
only a header, a resumed request and ``lru`` are not.
"""

from __future__ import annotations

import pytest
from factories import config
from test_hybrid_policy import FULL, SWA, manager, run

from hybridkv import KVCacheManager, Request
from hybridkv.core.cost_aware import CostAwareEvictionPolicy
from hybridkv.core.free_queue import FreeKVCacheBlockQueue
from hybridkv.managers.returning import SAMPLE_BLOCKS, SEEN_PER_BLOCK, SeenPrefixes


def chain(text: str) -> list[bytes]:
    """Chained block hashes, one block per letter: each block's hash is the
    whole prefix it ends (as ``hybridkv.hashing``'s determine theirs)."""
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
    assert seen.returning(chain("abxy"), 1, 4) is False  # ab + x: abx, not abc
    assert seen.returning(chain("abcy"), 1, 4)
    # 14 tokens: half is 7 blocks, rounded up to 9; 8 whole blocks: too short.
    assert not seen.returning(chain("abcdefgh"), 1, 14)
    # With 9 whole blocks the sample abcdefghi decides: never recorded (the
    # 7 blocks recorded end before it), so not returning.
    assert not seen.returning(chain("abcdefghi"), 1, 14)


def test_the_manager_samples_every_sample_blocks_blocks() -> None:
    """The coordinator's memory keeps ``SEEN_PER_BLOCK`` blocks of history
    per pool block, one sample in ``SAMPLE_BLOCKS``."""
    kv = manager(FULL, SWA, num_blocks=80, weight=1.0, bonus=2.0)
    seen = kv.coordinator.seen
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
    assert kv.coordinator.return_factor == 4.0
    run(kv, "a", list(range(32)))
    a_units = [8, 16, 7, 15, 6, 5, 4, 3, 2, 1]
    assert keyed(kv) == [(i, 3, pytest.approx(k / 63 + 1.5)) for k, i in enumerate(a_units, 1)]
    assert run(kv, "b", [*range(32), *range(100, 104)]) == 32
    b_units = [(14, 6), (13, 6)] + [(i, 7) for i in a_units]
    assert keyed(kv) == [
        (i, cls, pytest.approx(clock / 63 + cls / 2))
        for clock, (i, cls) in enumerate(b_units, len(a_units) + 1)
    ]


def test_a_shared_header_alone_is_not_returning_by_hand() -> None:
    """C shares A's first 8 tokens (2 blocks) of its 36: half needs 5 blocks,
    so C is a first turn and keeps the plain values (its own unit 36 would
    be class 6 if it were returning)."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    run(kv, "a", list(range(32)))
    c = Request("c", [*range(8), *range(200, 228)])
    blocks, hit = kv.get_computed_blocks(c)
    assert kv.allocate_slots(c, 36 - hit, hit, blocks) is not None
    assert c.returning is False
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
    assert d.returning is False
    kv.free(d)  # preempted
    d.num_preemptions += 1
    d.num_computed_tokens = 0
    assert kv.coordinator.is_returning(d.live_block_hashes, d.num_prompt_tokens)
    blocks, hit = kv.get_computed_blocks(d)
    assert hit == 36
    assert kv.allocate_slots(d, 40 - hit, hit, blocks) is not None
    assert d.returning is False
    assert "d" not in kv.coordinator._returning
    kv.check_integrity()


@pytest.mark.parametrize(
    ("policy", "bonus", "weight"), [("lru", 2.0, 1.0), ("hybrid", 0.0, 1.0), ("hybrid", 2.0, 0.0)]
)
def test_off_under_lru_without_bonus_or_ranking(policy: str, bonus: float, weight: float) -> None:
    """Nothing is remembered or marked under ``lru``, with bonus 0, or when
    the free set ranks by recency only (weight 0: a factor would change nothing)."""
    kv = manager(FULL, SWA, policy=policy, weight=weight, bonus=bonus)
    assert kv.coordinator.seen is None
    assert kv.coordinator.return_factor == 1.0
    run(kv, "a", list(range(32)))
    b = Request("b", [*range(32), *range(100, 104)])
    blocks, hit = kv.get_computed_blocks(b)
    assert kv.allocate_slots(b, 36 - hit, hit, blocks) is not None
    assert b.returning is None
    assert kv.coordinator.is_returning(b.live_block_hashes, b.num_prompt_tokens) is False


def test_a_bonus_under_one_turnover_still_counts() -> None:
    """Bonus 0.5 at weight 2: a factor of 2 ** 0.25."""
    kv = manager(FULL, SWA, weight=2.0, bonus=0.5)
    assert kv.coordinator.seen is not None
    assert kv.coordinator.return_factor == pytest.approx(2**0.25)


def test_no_memory_when_the_free_set_is_overridden() -> None:
    """``eviction_policy`` overrides the ordering: under ``lru`` with a
    cost-aware free set, or under ``hybrid`` with a recency-only one, there is
    no returning rule to apply (the memory would only cost)."""
    cfg = config(64, FULL, SWA)
    lru = KVCacheManager(cfg, 256, cache_policy="lru", eviction_policy=CostAwareEvictionPolicy)
    assert lru.coordinator.seen is None
    plain = KVCacheManager(cfg, 256, cache_policy="hybrid", eviction_policy=FreeKVCacheBlockQueue)
    assert plain.coordinator.seen is None and plain.coordinator.return_factor == 1.0


def test_a_free_without_hashes_records_nothing() -> None:
    """``KVCacheCoordinator.free`` without the request's hashes (a caller that
    drives the coordinator itself) releases as usual and remembers nothing."""
    kv = manager(FULL, SWA, weight=1.0, bonus=2.0)
    a = Request("a", list(range(32)))
    blocks, hit = kv.get_computed_blocks(a)
    assert kv.allocate_slots(a, 32, hit, blocks) is not None
    assert kv.coordinator.free("a") is True
    assert len(kv.coordinator.seen) == 0  # type: ignore[arg-type]
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
    assert "b" not in kv.coordinator._returning


def test_capacity_zero_and_share_one_are_valid() -> None:
    nothing = SeenPrefixes(0, stride=1)
    nothing.record([b"a"])
    assert len(nothing) == 0
    assert not nothing.returning([b"a"], 1, 1)
    whole = SeenPrefixes(4, share=1.0, stride=1)
    whole.record(chain("ab"))
    assert whole.returning(chain("ab"), 4, 8)
    assert not whole.returning(chain("ab"), 4, 9)  # 9 tokens need 3 blocks
