"""``MooncakeTier`` against a real ``mooncake_master`` on loopback: round trips,
batches, other fingerprints, corrupt objects, and the write queue's bound."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from tier_factories import fingerprint, key, tier_on

from hybridkv.tiers import (
    CorruptEntryError,
    ModelFingerprint,
    MooncakeTier,
    TierFullError,
    entry_file,
)
from hybridkv.tiers.store_master import MooncakeMaster

SMALL = "&segment=16MiB&buffer=16MiB"


def connect(
    master: MooncakeMaster, fp: ModelFingerprint | None = None, extra: str = ""
) -> MooncakeTier:
    return MooncakeTier.connect(fp or fingerprint(), master.url + SMALL + extra)


@pytest.fixture(scope="module")
def shared(mooncake_master: MooncakeMaster) -> Iterator[MooncakeTier]:
    t = connect(mooncake_master)  # one client for the module: leaving takes 1-2 s
    yield t
    t.close()


@pytest.fixture
def tier(shared: MooncakeTier) -> Iterator[MooncakeTier]:
    """A tier with fresh counters on the module's client."""
    yield from tier_on(shared)


def parts(i: int) -> list[bytes]:
    rng = np.random.default_rng(i)
    return [rng.bytes(1000 + i), rng.bytes(64)]


def test_a_batch_round_trips_into_buffers_and_as_parts(tier: MooncakeTier) -> None:
    keys = [key(i, group=i % 2) for i in range(6)]
    stores = tier.store_many([(k, parts(i), None) for i, k in enumerate(keys)])
    assert all(t.wait() for t in stores)
    tier.check_integrity()
    assert tier.used_bytes == 0  # the write queue drained
    assert tier.contains_many([*keys, key(99)]) == [True] * 6 + [False]
    into = [[np.zeros(1000 + i, np.uint8), np.zeros(64, np.uint8)] for i in range(6)]
    loads = tier.load_many(list(zip(keys, into, strict=True)))
    assert all(t is not None and t.wait() for t in loads)
    for i, bufs in enumerate(into):
        assert [b.tobytes() for b in bufs] == parts(i)
    (whole,) = tier.load_many([(keys[2], None)])
    assert whole is not None and whole.wait()
    assert [bytes(p) for p in whole.result] == parts(2)
    assert tier.stats.stores == 6 and tier.stats.loads == 7
    assert tier.store_stats.put_batches == 1 and tier.store_stats.get_batches == 2
    assert set(tier.keys()) == set(keys)


def test_a_missing_object_is_a_failed_load_and_a_second_store_is_not_sent(
    tier: MooncakeTier,
) -> None:
    (t,) = tier.load_many([(key(1234), None)])
    assert t is not None and not t.wait()
    assert tier.stats.misses == 1 and tier.stats.load_failures == 1
    assert tier.store(key(5), parts(5)).wait()
    assert tier.store(key(5), parts(5)).wait()
    assert tier.store_stats.already_there == 1 and tier.stats.stores == 2


def test_another_fingerprint_never_sees_an_entry(tier: MooncakeTier) -> None:
    mine = tier
    others = [
        MooncakeTier(fp, tier.client, 1 << 20, owns_client=False)
        for fp in (
            fingerprint("ckpt-b"),  # other weights
            fingerprint(dtype="float16"),  # other dtype
            fingerprint(block_size=32),  # other layout
        )
    ]
    try:
        assert mine.store(key(7), parts(7)).wait()
        for other in others:
            assert other.contains_many([key(7)]) == [False]
            (t,) = other.load_many([(key(7), None)])
            assert t is not None and not t.wait()
    finally:
        for t in others:
            t.close()


def test_an_entry_of_another_fingerprint_under_our_name_is_refused_and_removed(
    tier: MooncakeTier, mooncake_master: MooncakeMaster
) -> None:
    """A forged object (another fingerprint's bytes put under this tier's name) and a
    flipped byte are failed loads: never served, removed, counted."""
    other = fingerprint("ckpt-z")
    views = [memoryview(p) for p in parts(8)]
    forged = bytearray(entry_file.entry_header(other.digest, key(8), views) + b"".join(views))
    good = [memoryview(p) for p in parts(9)]
    flipped = bytearray(entry_file.entry_header(tier.fingerprint.digest, key(9), good))
    flipped += b"".join(good)
    flipped[-5] ^= 0x40
    codes = tier.client.put([tier.name(key(8)), tier.name(key(9))], [forged, flipped])
    assert codes == [0, 0]
    loads = tier.load_many([(key(8), None), (key(9), None)])
    for t in loads:
        assert t is not None and not t.wait()
        assert isinstance(t.error, CorruptEntryError)
    assert tier.stats.corrupt_removed == 2
    assert tier.contains_many([key(8), key(9)]) == [False, False]


def test_a_full_write_queue_skips_stores_without_waiting(shared: MooncakeTier) -> None:
    tier = MooncakeTier(shared.fingerprint, shared.client, 4 << 10, owns_client=False)
    try:
        stores = tier.store_many([(key(100 + i), [bytes(1500)], None) for i in range(4)])
        errors = [t.error if t.done() else None for t in stores]
        assert sum(isinstance(e, TierFullError) for e in errors) == 2  # 2 x ~1.6 KiB fit
        assert all(t.wait() for t in stores if not isinstance(t.error, TierFullError))
        assert tier.stats.store_skips == 2 and tier.used_bytes == 0
        tier.check_integrity()
    finally:
        tier.close()


def test_a_full_store_skips_puts_and_its_eviction_makes_misses(
    fresh_mooncake_master: MooncakeMaster,
) -> None:
    """A 16 MiB pool (the smallest) and 48 units of 512 KiB: the store has no room for
    some puts (skipped and counted, no error), evicts older entries as their leases
    end, and those are misses here; whatever is loaded is the bytes stored."""
    tier = MooncakeTier.connect(fingerprint(), fresh_mooncake_master.url + "&segment=16MiB")
    n = 48
    try:
        blob = [np.full(512 << 10, i, np.uint8).tobytes() for i in range(n)]
        landed = sum(tier.store(key(200 + i), [blob[i]]).wait() for i in range(n))
        assert tier.stats.store_skips >= 1, tier.stats
        assert landed == tier.stats.stores >= 8
        held = tier.contains_many([key(200 + i) for i in range(n)])
        assert 0 < sum(held) < n  # evicted or never stored: misses, not errors
        loaded = 0
        for i in range(n):
            (t,) = tier.load_many([(key(200 + i), None)])
            assert t is not None
            if t.wait():
                assert bytes(t.result[0]) == blob[i]
                loaded += 1
        assert loaded >= 1
        tier.check_integrity()
    finally:
        tier.close()
