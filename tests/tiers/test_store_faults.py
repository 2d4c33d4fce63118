"""``MooncakeTier`` under faults: a master that cannot be reached at start (an
error, or with ``optional=1`` a start without it and a late join), and one
killed mid-run and restarted. Nothing fails a caller: misses and skipped writes,
one warning per outage, and the tier works again once the master is back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from tier_factories import fingerprint, key

from hybridkv.tiers import MooncakeTier, TierError, store_client
from hybridkv.tiers.store_master import MooncakeMaster, free_port

SMALL = "&segment=16MiB&buffer=16MiB"


def eventually(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_master_that_cannot_be_reached_is_one_error_naming_it_at_once() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(TierError, match=rf"master at 127\.0\.0\.1:{port} cannot be reached"):
        MooncakeTier.connect(fingerprint(), f"mooncake://127.0.0.1:{port}")
    assert time.monotonic() - started < 5  # the client's own set-up would retry for ~90 s


def test_optional_starts_without_an_unreachable_store_and_joins_it_once_it_is_there(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_client, "JOIN_RETRY_SECONDS", 0.1)
    registered: list[tuple[int, int]] = []  # the staging memory, registered on the join
    real_register = store_client._register

    def register(store: object, address: int, size: int) -> None:
        registered.append((address, size))
        real_register(store, address, size)

    monkeypatch.setattr(store_client, "_register", register)
    master = MooncakeMaster(lease_ms=300)  # its ports chosen, not started yet
    started = time.monotonic()
    with caplog.at_level(logging.INFO, "hybridkv.tiers"):
        tier = MooncakeTier.connect(fingerprint(), master.url + SMALL + "&optional=1")
        try:
            assert time.monotonic() - started < 5
            assert not tier.client.joined and not tier.client.healthy()
            assert registered == []  # nothing to register with yet
            # Off: misses and skipped writes, answered at once, nothing raised.
            assert not tier.store(key(1), [b"a" * 500]).wait()
            assert tier.load_many([(key(1), None)]) == [None]
            assert tier.contains_many([key(1)]) == [False]
            master.start()
            assert eventually(tier.client.healthy, 30), "not joined once the master was up"
            assert tier.client.joined and tier.client.epoch == 1
            region = tier.io.region  # type: ignore[attr-defined]  # zerocopy=1: StagedIO
            assert registered == [(region.address, region.nbytes)]
            assert tier.store(key(2), [b"b" * 500]).wait()
            (t,) = tier.load_many([(key(2), None)])
            assert t is not None and t.wait() and bytes(t.result[0]) == b"b" * 500
            tier.check_integrity()
        finally:
            tier.close()
            master.stop()
    said = [r.getMessage() for r in caplog.records]
    warned = [m for m in said if "starting without the store" in m]
    assert len(warned) == 1 and f"127.0.0.1:{master.port} cannot be reached" in warned[0]
    assert sum("is joined" in m for m in said) == 1, said
    assert not any("unreachable" in m for m in said), said  # no outage warning on top


def test_optional_close_before_the_store_is_there_stops_trying_at_once() -> None:
    port = free_port()
    tier = MooncakeTier.connect(fingerprint(), f"mooncake://127.0.0.1:{port}?optional=1")
    joiner = tier.client._joiner
    assert joiner is not None and joiner.is_alive()
    started = time.monotonic()
    tier.close()
    assert not joiner.is_alive() and time.monotonic() - started < 1


def test_a_metadata_server_that_cannot_be_reached_is_named(
    mooncake_master: MooncakeMaster,
) -> None:
    port = free_port()
    url = f"mooncake://127.0.0.1:{mooncake_master.port}?metadata=http://127.0.0.1:{port}/metadata"
    with pytest.raises(TierError, match=rf"metadata server http://127\.0\.0\.1:{port}/metadata"):
        MooncakeTier.connect(fingerprint(), url)


def test_a_master_killed_mid_run_means_misses_one_warning_and_a_reconnect(
    fresh_mooncake_master: MooncakeMaster, caplog: pytest.LogCaptureFixture
) -> None:
    master = fresh_mooncake_master
    tier = MooncakeTier.connect(fingerprint(), master.url + SMALL)
    try:
        assert tier.store(key(1), [b"a" * 500]).wait()
        with caplog.at_level(logging.WARNING, "hybridkv.tiers"):
            master.kill()
            assert eventually(lambda: not tier.client.healthy(), 15), "the outage was not seen"
            started = time.monotonic()
            for i in range(20):  # requests meanwhile: answered at once, nothing raised
                assert not tier.store(key(100 + i), [b"b" * 500]).wait()
                assert tier.load_many([(key(1), None)]) == [None]
                assert tier.contains_many([key(1), key(2)]) == [False, False]
            assert time.monotonic() - started < 2
            tier.check_integrity()
            master.start()
            assert eventually(tier.client.healthy, 30), "no reconnect after the master came back"
        outage = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(outage) == 1, [r.getMessage() for r in caplog.records]
        assert tier.client.epoch == 1 and tier.client.outages == 1
        assert tier.take_gone() == [key(1)]  # what it wrote before: reported gone (BlockRemoved)
        assert tier.store_stats.unreachable >= 60
        # Back: the restarted master knows nothing of before (a miss), and works.
        assert tier.contains_many([key(1)]) == [False]
        assert eventually(lambda: tier.store(key(3), [b"c" * 500]).wait(), 10)
        (t,) = tier.load_many([(key(3), None)])
        assert t is not None and t.wait() and bytes(t.result[0]) == b"c" * 500
        tier.check_integrity()
    finally:
        tier.close()
