"""``MooncakeTier`` under faults: a master that cannot be reached at start, and one
killed mid-run and restarted. Nothing fails a caller: misses and skipped writes,
one warning per outage, and the tier works again once the master is back."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from tier_factories import fingerprint, key

from hybridkv.tiers import MooncakeTier, TierError
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
