"""``HostTier``: asynchronous stores and loads, the budget, pins, eviction order."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
from tier_factories import GateCopier, fingerprint, key

from hybridkv.policy import unit_class
from hybridkv.tiers import HostTier, RankRule, TierFullError
from hybridkv.tiers.copier import Copier, InlineCopier
from hybridkv.tiers.memory import BytesMemory
from hybridkv.tiers.transfer import Completion


def inline_tier(budget: int, **kw: object) -> HostTier:
    return HostTier(fingerprint(), budget, copier=InlineCopier(), **kw)  # type: ignore[arg-type]


def test_store_then_load_on_the_copy_thread() -> None:
    tier = HostTier(fingerprint(), 1 << 20)
    parts = [bytes(range(256)) * 4, b"", b"state"]
    assert tier.store(key(1), parts).wait()
    assert tier.contains(key(1)) and tier.used_bytes == 1024 + 5
    loaded = tier.load(key(1))
    assert loaded is not None and loaded.wait() and list(loaded.result) == parts
    into = [bytearray(1024), bytearray(0), bytearray(5)]
    again = tier.load(key(1), into=into)
    assert again is not None and again.wait() and into == parts
    assert tier.load(key(2)) is None
    assert tier.stats.as_dict() | {} == {
        **tier.stats.as_dict(),
        "stores": 1,
        "loads": 2,
        "misses": 1,
    }
    tier.check_integrity()
    tier.close()


def test_an_entry_in_flight_is_not_served_nor_evicted() -> None:
    gate = GateCopier()
    tier = HostTier(fingerprint(), 100, copier=gate)
    pending = tier.store(key(1), [bytes(60)])
    assert not pending.done() and not tier.contains(key(1)) and tier.load(key(1)) is None
    # The budget counts the reservation: 60 + 60 > 100 and the first cannot be evicted.
    skipped = tier.store(key(2), [bytes(60)])
    assert skipped.done() and isinstance(skipped.error, TierFullError)
    assert not tier.evict(key(1))
    tier.check_integrity()
    gate.run()
    assert pending.done() and pending.error is None and tier.contains(key(1))
    load = tier.load(key(1))
    assert load is not None and not load.done()
    assert not tier.evict(key(1))  # a load holds it
    assert isinstance(tier.store(key(2), [bytes(60)]).error, TierFullError)
    gate.run()
    assert load.wait() and tier.evict(key(1)) and tier.used_bytes == 0
    tier.check_integrity()


def test_lru_by_default_and_a_ranking_hook() -> None:
    tier = inline_tier(30)
    for i in range(3):
        assert tier.store(key(i), [bytes(10)]).wait()
    tier.load(key(0))  # key 0 is now the most recent
    assert tier.store(key(3), [bytes(10)]).wait()
    assert sorted(tier.keys()) == sorted([key(0), key(2), key(3)])
    assert tier.stats.evictions == 1

    ranked = inline_tier(30, ranking=RankRule(1.0, partial(unit_class, page_bytes=10)))
    for i, value in enumerate((5.0, 1.0, 9.0)):
        assert ranked.store(key(i), [bytes(10)], value=value).wait()
    assert ranked.store(key(3), [bytes(20)], value=2.0).wait()  # drops values 1 and 5
    assert sorted(ranked.keys()) == sorted([key(2), key(3)])
    ranked.check_integrity()


def test_touch_is_a_use_without_a_copy() -> None:
    tier = inline_tier(30)
    for i in range(3):
        assert tier.store(key(i), [bytes(10)]).wait()
    assert tier.touch([key(0), key(9)]) == [True, False]  # held, unknown
    assert tier.store(key(3), [bytes(10)]).wait()  # evicts the least recently used: key 1
    assert sorted(tier.keys()) == sorted([key(0), key(2), key(3)])
    assert tier.stats.stores == 4 and tier.stats.loads == 0
    tier.check_integrity()


def test_pinned_entries_are_never_evicted() -> None:
    tier = inline_tier(20)
    tier.store(key(0), [bytes(10)])
    tier.store(key(1), [bytes(10)])
    tier.pin(key(0))
    tier.pin(key(1))
    assert isinstance(tier.store(key(2), [bytes(10)]).error, TierFullError)
    tier.unpin(key(1))
    assert tier.store(key(2), [bytes(10)]).wait()
    assert tier.contains(key(0)) and not tier.contains(key(1))
    with pytest.raises(ValueError, match="no pin"):
        tier.unpin(key(2))
    with pytest.raises(KeyError, match="does not hold"):
        tier.pin(key(1))
    tier.check_integrity()


def test_a_failed_copy_keeps_nothing_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    class LostDevice(BytesMemory):
        """Copies that fail (the device went away mid-copy)."""

        def begin_store(self, buf: Any, parts: Sequence[Any], copier: Copier) -> Completion:
            def fail() -> None:
                raise OSError("device lost")

            return copier.submit(fail)

    tier = HostTier(fingerprint(), 100, LostDevice())
    with caplog.at_level(logging.WARNING, "hybridkv.tiers"):
        failed = [tier.store(key(i), [bytes(8)]) for i in range(2)]
        assert [t.wait() for t in failed] == [False, False]
    assert tier.used_bytes == 0 and tier.keys() == [] and tier.stats.store_failures == 2
    assert len([r for r in caplog.records if "store failed" in r.getMessage()]) == 1
    tier.check_integrity()
    tier.close()


def test_a_store_larger_than_the_budget_is_skipped_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tier = inline_tier(16)
    with caplog.at_level(logging.WARNING, "hybridkv.tiers"):
        assert not tier.store(key(0), [bytes(17)]).wait()
        assert not tier.store(key(1), [bytes(17)]).wait()
    assert tier.stats.store_skips == 2 and len(caplog.records) == 1
    assert "larger than the tier's budget" in caplog.records[0].getMessage()


def test_buffers_are_reused_and_held_memory_stays_in_budget() -> None:
    tier = inline_tier(100)
    for i in range(20):
        assert tier.store(key(i), [bytes([i]) * (10 + 30 * (i % 3))]).wait()
        tier.check_integrity()
        assert tier.held_bytes <= 100
    last = tier.load(key(19))
    assert last is not None and last.wait() and bytes(last.result[0]) == bytes([19]) * 40


def test_bad_parts_and_into_name_the_problem() -> None:
    tier = inline_tier(100)
    with pytest.raises(ValueError, match="part 0 must be bytes-like"):
        tier.store(key(0), [object()])
    tier.store(key(0), [bytes(4)])
    with pytest.raises(ValueError, match="into has parts of"):
        tier.load(key(0), into=[bytearray(3)])
    with pytest.raises(ValueError, match="writable"):
        tier.load(key(0), into=[bytes(4)])
    tier.check_integrity()  # the failed loads released their pins
    assert tier.evict(key(0))


def test_the_tier_package_imports_no_torch() -> None:
    code = "import sys, hybridkv.tiers, hybridkv.tiers.disk; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_batch_runs_as_one_job_and_each_entry_settles_alone() -> None:
    gate = GateCopier()
    tier = HostTier(fingerprint(), 100, copier=gate)
    stores = tier.store_many([(key(i), [bytes([i]) * 10], None) for i in range(3)])
    assert len(gate.jobs) == 1 and not any(t.done() for t in stores)
    gate.run()
    assert all(t.wait() for t in stores) and len(tier.keys()) == 3
    into = [bytearray(10), bytearray(9)]  # the second is the wrong size: refused up front
    with pytest.raises(ValueError, match="into has parts of"):
        tier.load_many([(key(0), [into[0]]), (key(1), [into[1]])])
    tier.check_integrity()  # the refused batch left no pin behind
    loads = tier.load_many([(key(0), [into[0]]), (key(7), None), (key(2), None)])
    assert loads[1] is None and len(gate.jobs) == 1
    gate.run()
    assert loads[0] is not None and loads[0].wait() and into[0] == bytes([0]) * 10
    assert loads[2] is not None and loads[2].wait() and loads[2].result == (bytes([2]) * 10,)
    tier.check_integrity()
