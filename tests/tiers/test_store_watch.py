"""The store's own evictions, seen by the replica that wrote the objects
(``tiers/store_watch.py``): ``LandedKeys``' bookkeeping, then a real 16 MiB store
on loopback filled until it evicts, seen by a lookup, a load and the sweep."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from tier_factories import fingerprint, key

from hybridkv.tiers import MooncakeTier, UnitKey
from hybridkv.tiers.store_master import MooncakeMaster
from hybridkv.tiers.store_watch import LandedKeys

# -- LandedKeys ----------------------------------------------------------------------


def test_a_key_is_lost_only_at_the_landing_its_check_began_with() -> None:
    w = LandedKeys(limit=8)
    w.landed(key(1), epoch=0)
    w.landed(key(2), epoch=0)
    before = w.snapshot([key(1), key(2), key(3)])
    assert [k for k, _ in before] == [key(1), key(2)]  # key(3) was never landed
    w.landed(key(1), epoch=0)  # written again while the check was on its way
    assert w.lost(before) == 1  # only key(2): key(1)'s new landing wins
    assert w.take_gone() == [key(2)] and w.take_gone() == []
    assert key(1) in w and key(2) not in w
    w.check_integrity()


def test_a_key_landed_again_after_it_was_lost_is_not_reported() -> None:
    w = LandedKeys(limit=8)
    w.landed(key(1), epoch=0)
    assert w.lost(w.snapshot([key(1)])) == 1
    w.landed(key(1), epoch=0)  # put back before the engine drained the report
    assert w.take_gone() == []


def test_keys_pushed_out_removed_or_lost_with_the_master_are_reported() -> None:
    w = LandedKeys(limit=3)
    for i in range(5):
        w.landed(key(i), epoch=0)
    assert w.take_gone() == [key(0), key(1)]  # no longer watched: reported
    w.drop(key(3))  # removed by this replica
    w.drop(key(99))  # never landed: nothing
    assert w.take_gone() == [key(3)]
    w.sync(epoch=1)  # the client came back after an outage
    assert w.take_gone() == [key(2), key(4)] and len(w) == 0
    w.check_integrity()


def test_the_sweep_order_is_the_longest_unchecked_first() -> None:
    w = LandedKeys(limit=8)
    for i in range(4):
        w.landed(key(i), epoch=0)
    first = w.oldest(2)
    assert [k for k, _ in first] == [key(0), key(1)]
    w.seen(first)  # present: checked again last
    assert [k for k, _ in w.oldest(4)] == [key(2), key(3), key(0), key(1)]


# -- against a real store ------------------------------------------------------------

BLOB = 512 << 10


@pytest.fixture
def small_store(fresh_mooncake_master: MooncakeMaster) -> Iterator[MooncakeTier]:
    """A 16 MiB store (the smallest), this tier its only replica, no sweep."""
    tier = MooncakeTier.connect(fingerprint(), fresh_mooncake_master.url + "&segment=16MiB&sweep=0")
    yield tier
    tier.check_integrity()
    tier.close()


def fill_until_evicted(tier: MooncakeTier) -> tuple[list[UnitKey], set[UnitKey]]:
    """Write 512 KiB objects in rounds, past each round's 300 ms leases, until the
    store has evicted some that landed: the landed keys, and those gone (asked of
    the store directly, not through the tier's watch)."""
    blob = np.zeros(BLOB, np.uint8).tobytes()
    landed: list[UnitKey] = []
    for r in range(6):
        batch = [key(1000 * r + i) for i in range(40)]
        landed += [k for k in batch if tier.store(k, [blob]).wait()]
        held = tier.client.exists([tier.name(k) for k in landed])
        gone = {k for k, h in zip(landed, held, strict=True) if not h}
        if gone:
            return landed, gone
        time.sleep(0.4)
    raise AssertionError("the store evicted nothing in 6 rounds")


def test_an_eviction_is_seen_lazily_by_a_lookup_and_by_a_load(small_store: MooncakeTier) -> None:
    tier = small_store
    landed, gone = fill_until_evicted(tier)
    assert tier.take_gone() == []  # nothing asked about them yet: not seen
    # A lookup of a gone key (another request's prefix) sees it.
    one, there = next(iter(gone)), next(k for k in landed if k not in gone)
    assert tier.contains_many([one, there]) == [False, True]
    assert tier.take_gone() == [one]
    # A load of the others sees them (confirmed with one batch_is_exist).
    rest = [k for k in landed if k in gone and k != one]
    loads = tier.load_many([(k, None) for k in rest])
    assert all(t is not None and not t.wait() for t in loads)
    assert set(tier.take_gone()) == set(rest)
    assert tier.store_stats.found_gone == len(gone)
    # Each reported once; the watch keeps what is still there.
    assert tier.take_gone() == []
    assert set(tier.keys()) == set(landed) - gone


def test_the_sweep_sees_evictions_nothing_asked_about(
    fresh_mooncake_master: MooncakeMaster,
) -> None:
    tier = MooncakeTier.connect(
        fingerprint(), fresh_mooncake_master.url + "&segment=16MiB&sweep=0.05"
    )
    try:
        landed, gone = fill_until_evicted(tier)
        reported: list[UnitKey] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            reported += tier.take_gone()  # the engine's call: starts a sweep when due
            held = tier.client.exists([tier.name(k) for k in landed])
            gone = {k for k, h in zip(landed, held, strict=True) if not h}  # the store's truth
            if set(reported) == gone:
                break
            time.sleep(0.02)
        assert sorted(reported) == sorted(gone)  # each once, and only what is gone
        assert tier.store_stats.sweeps >= 1
        assert set(tier.keys()) == set(landed) - gone
        tier.check_integrity()
    finally:
        tier.close()
