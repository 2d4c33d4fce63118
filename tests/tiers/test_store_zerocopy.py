"""``MooncakeTier`` through registered staging memory (``store_io.StagedIO``) against a
real ``mooncake_master`` on loopback: round trips, a byte flipped in the staging region,
staging full (writes skipped, loads missed, both counted), the copying path kept as
``zerocopy=0``, and ``close`` unregistering the region. Plus ``Ranges`` on its own."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest
from tier_factories import fingerprint, key, tier_on

from hybridkv.tiers import CorruptEntryError, MooncakeTier, TierFullError, entry_file
from hybridkv.tiers.store_io import CopyingIO, StagedIO
from hybridkv.tiers.store_master import MooncakeMaster
from hybridkv.tiers.store_staging import ALIGN, Ranges

SMALL = "&segment=16MiB&buffer=16MiB&queue=1MiB"


@pytest.fixture(scope="module")
def shared(mooncake_master: MooncakeMaster) -> Iterator[MooncakeTier]:
    t = MooncakeTier.connect(fingerprint(), mooncake_master.url + SMALL)  # staging 64MiB
    yield t
    t.close()


@pytest.fixture
def tier(shared: MooncakeTier) -> Iterator[MooncakeTier]:
    yield from tier_on(shared)


def parts(i: int, n: int = 3000) -> list[bytes]:
    rng = np.random.default_rng(i)
    return [rng.bytes(n + i), rng.bytes(96)]


def zeros(i: int, n: int = 3000) -> list[np.ndarray]:
    return [np.zeros(n + i, np.uint8), np.zeros(96, np.uint8)]


def test_a_batch_round_trips_through_the_registered_region(
    tier: MooncakeTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(tier.io, StagedIO)
    region = tier.io.region
    assert tier.client.registered[region.address] == region.nbytes
    # the copying calls are not used: each would fail the test
    monkeypatch.setattr(tier.client, "get", lambda names: pytest.fail("get_batch used"))
    monkeypatch.setattr(tier.client, "put", lambda *a: pytest.fail("unregistered put"))
    keys = [key(i, group=i % 2) for i in range(5)]
    assert all(t.wait() for t in tier.store_many([(k, parts(i), None) for i, k in enumerate(keys)]))
    assert region.writes.taken_bytes == 0  # every write's range given back
    into = [zeros(i) for i in range(5)]
    loads = tier.load_many(list(zip(keys, into, strict=True)))
    assert all(t is not None and t.wait() for t in loads)
    assert [[b.tobytes() for b in bufs] for bufs in into] == [parts(i) for i in range(5)]
    (whole,) = tier.load_many([(keys[3], None)])  # no into: copies out of the staging
    assert whole is not None and whole.wait()
    assert [bytes(p) for p in whole.result] == parts(3)
    assert region.reads.taken_bytes == 0
    assert tier.store_stats.put_batches == 1 and tier.store_stats.get_batches == 2
    size = [entry_file.header_length(k, 2) + sum(map(len, parts(i))) for i, k in enumerate(keys)]
    assert tier.store_stats.put_bytes == sum(size)
    assert tier.store_stats.get_bytes == sum(size) + size[3]
    assert tier.stats.stores == 5 and tier.stats.loads == 6


def test_a_byte_flipped_in_the_staging_region_is_a_failed_load_into_untouched(
    tier: MooncakeTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tier.store(key(20), parts(20)).wait()
    real = tier.client.get_into

    def flip(names: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        codes = real(names, ptrs, sizes)
        byte = ctypes.c_uint8.from_address(ptrs[0] + codes[0] - 7)  # in the payload
        byte.value ^= 0x10
        return codes

    monkeypatch.setattr(tier.client, "get_into", flip)
    into = zeros(20)
    (t,) = tier.load_many([(key(20), into)])
    assert t is not None and not t.wait()
    assert isinstance(t.error, CorruptEntryError) and "checksum" in str(t.error)
    assert not any(b.any() for b in into)  # checked before a byte was copied into place
    assert tier.stats.corrupt_removed == 1 and tier.stats.load_failures == 1
    assert tier.contains_many([key(20)]) == [False]  # removed from the store


def test_a_write_with_no_free_staging_range_is_skipped_and_counted(tier: MooncakeTier) -> None:
    assert isinstance(tier.io, StagedIO)
    writes = tier.io.region.writes
    held = writes.take(writes.size - 2048)  # another write's range, still in flight
    assert held is not None
    try:
        (t,) = tier.store_many([(key(30), parts(30), None)])  # ~3 KiB: no range that long
        assert t.done() and isinstance(t.error, TierFullError)
        assert tier.stats.store_skips == 1 and tier.store_stats.staging_skips == 1
        assert tier.used_bytes == 0
    finally:
        writes.give(held)
    assert tier.store(key(30), parts(30)).wait()  # room again
    tier.check_integrity()


def test_a_load_larger_than_the_read_staging_is_a_counted_miss_and_batches_go_in_rounds(
    mooncake_master: MooncakeMaster,
) -> None:
    """8 KiB of read staging: a 12 KiB unit cannot be read (a miss, recomputed); four
    ~3 KiB units are read in rounds of two, all in one ``load_many``."""
    tier = MooncakeTier.connect(fingerprint(), mooncake_master.url + SMALL + "&staging=8KiB")
    try:
        big = [np.full(12 << 10, 7, np.uint8).tobytes()]
        assert tier.store(key(40), big).wait()
        (t,) = tier.load_many([(key(40), [np.zeros(12 << 10, np.uint8)])])
        assert t is not None and not t.wait() and isinstance(t.error, KeyError)
        assert tier.store_stats.staging_misses == 1 and tier.stats.misses == 1
        keys = [key(41 + i) for i in range(4)]
        assert all(tier.store(k, parts(i)).wait() for i, k in enumerate(keys))
        into = [zeros(i) for i in range(4)]
        loads = tier.load_many(list(zip(keys, into, strict=True)))
        assert all(t is not None and t.wait() for t in loads)
        assert [[b.tobytes() for b in bufs] for bufs in into] == [parts(i) for i in range(4)]
        assert tier.store_stats.staging_misses == 1
        tier.check_integrity()
    finally:
        tier.close()


def test_zerocopy_0_keeps_the_copying_path(shared: MooncakeTier) -> None:
    tier = MooncakeTier(
        shared.fingerprint, shared.client, 1 << 20, owns_client=False, zero_copy=False
    )
    try:
        assert isinstance(tier.io, CopyingIO)
        registered = shared.client.registered
        assert tier.store(key(50), parts(50)).wait()
        into = zeros(50)
        (t,) = tier.load_many([(key(50), into)])
        assert t is not None and t.wait()
        assert [b.tobytes() for b in into] == parts(50)
        assert shared.client.registered == registered  # it registered nothing
    finally:
        tier.close()


def test_close_unregisters_and_frees_the_region(shared: MooncakeTier) -> None:
    tier = MooncakeTier(shared.fingerprint, shared.client, 1 << 20, owns_client=False)
    assert isinstance(tier.io, StagedIO)
    region = tier.io.region
    assert region.address in shared.client.registered
    assert tier.store(key(60), parts(60)).wait()
    tier.close()
    assert region.address not in shared.client.registered and region.closed
    assert shared.io.region.address in shared.client.registered  # the other tier's stays
    tier.close()  # twice: nothing more


def test_ranges_take_align_give_back_and_merge() -> None:
    r = Ranges(0, 10 * ALIGN)
    a, b, c = r.take(1), r.take(ALIGN + 1), r.take(3 * ALIGN)
    assert (a, b, c) == (0, ALIGN, 3 * ALIGN)
    assert r.take(5 * ALIGN) is None  # 4 x ALIGN left
    r.give(b)
    assert r.take(2 * ALIGN) == ALIGN  # the hole is reused
    r.give(ALIGN)
    r.give(a)
    r.give(c)
    r.check_integrity()
    assert r.taken_bytes == 0 and r.take(10 * ALIGN) == 0  # merged back into one range


def test_held_batches_are_copied_at_once_and_put_as_one_at_send(tier: MooncakeTier) -> None:
    """``store_many(send=False)`` (a request's free, one call per run): each call's units
    are copied into staging at once (the block may be reused) and wait for ``send``,
    which puts every held batch as one."""
    src = [np.frombuffer(bytearray(parts(70 + i)[0]), np.uint8) for i in range(3)]
    first = tier.store_many([(key(70), [src[0]], None)], send=False)
    second = tier.store_many([(key(71), [src[1]], None), (key(72), [src[2]], None)], send=False)
    want = [s.tobytes() for s in src]
    for s in src:
        s[:] = 0  # the pool rows reused before the batch is sent
    assert not any(t.done() for t in [*first, *second])
    assert tier.store_stats.put_batches == 0
    tier.send()
    assert all(t.wait() for t in [*first, *second])
    assert tier.store_stats.put_batches == 1 and tier.stats.stores == 3
    for i in range(3):
        into = [np.zeros(len(want[i]), np.uint8)]
        (t,) = tier.load_many([(key(70 + i), into)])
        assert t is not None and t.wait() and into[0].tobytes() == want[i]


def test_an_object_larger_than_its_into_is_a_failed_load_and_removed(tier: MooncakeTier) -> None:
    """The room a load gives an object is its expected size (header + into's parts): a
    larger object under the name (another layout's, forged) does not fit, is refused by
    the client, and counts as corrupt, like a checksum failure."""
    assert tier.client.put([tier.name(key(80))], [bytearray(8000)]) == [0]
    into = [np.zeros(100, np.uint8)]
    (t,) = tier.load_many([(key(80), into)])
    assert t is not None and not t.wait() and isinstance(t.error, CorruptEntryError)
    assert tier.stats.corrupt_removed == 1 and not into[0].any()
    assert tier.contains_many([key(80)]) == [False]
