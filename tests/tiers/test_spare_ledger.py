"""Spare room in the engine's tiers (``EntryLedger``, ``HostTier``; ``tiers/spare.py``).

An entry stored with the value ``SPARE`` takes free bytes or older spare
entries' bytes, never a valued entry's (not even one of no value, nor under
plain LRU); spare entries are every store's first victims, least recently used
first; a pinned spare entry stays; a valued store of a spare key makes it valued,
a spare store of a valued key changes nothing. ``HostTier`` counts a spare store
with no room apart (no warning) and never spills a spare entry.
"""

from __future__ import annotations

import logging
from functools import partial

import pytest
import torch

from hybridkv.policy import unit_class
from hybridkv.tiers import HostTier, ModelFingerprint, TierFullError, UnitKey
from hybridkv.tiers.ledger import EntryLedger
from hybridkv.tiers.ranked_ledger import RankedLedger, ledger_for
from hybridkv.tiers.ranking import RankRule
from hybridkv.tiers.spare import SPARE, SpareRoom
from hybridkv.tiers.torch_memory import TorchHostMemory

RULE = RankRule(2.0, partial(unit_class, page_bytes=4))


def committed(ledger: EntryLedger, key: str, nbytes: int, value: float | None = None) -> None:
    assert ledger.reserve(key, nbytes, value) is not None
    ledger.commit(key)


@pytest.mark.parametrize("ranking", [None, RULE])
def test_a_spare_entry_takes_only_free_or_spare_bytes(ranking) -> None:  # type: ignore[no-untyped-def]
    ledger = ledger_for(8, ranking)
    committed(ledger, "none", 3)  # no value: ranks 0, still not spare
    committed(ledger, "cheap", 3, value=0.001)
    committed(ledger, "s1", 2, value=SPARE)
    assert ledger.reserve("s2", 2, SPARE) == ["s1"]  # 0 free + s1's 2
    ledger.commit("s2")
    assert ledger.reserve("s3", 4, SPARE) is None  # 0 free + s2's 2 < 4
    assert ledger.committed_keys() == ["none", "cheap", "s2"] and ledger.used_bytes == 8
    assert ledger.reserve("s4", 2, SPARE) == ["s2"]
    ledger.commit("s4")
    ledger.check_integrity()


@pytest.mark.parametrize("ranking", [None, RULE])
def test_spare_entries_are_the_first_victims(ranking) -> None:  # type: ignore[no-untyped-def]
    ledger = ledger_for(9, ranking)
    committed(ledger, "old", 3, value=1.0)
    committed(ledger, "s1", 3, value=SPARE)
    committed(ledger, "s2", 3, value=SPARE)
    ledger.touch("s1")  # s2 is now the least recently used spare entry
    assert ledger.reserve("new", 3, 1.0) == ["s2"]
    ledger.commit("new")
    ledger.pin("s1")  # a pinned spare entry stays: the valued ones go then
    assert ledger.reserve("newer", 3, 1.0) == ["old"]
    ledger.check_integrity()


def test_a_batch_pin_is_a_use_of_a_spare_entry() -> None:
    """``pin_held`` (a load's ``pin_batch``) touches a spare entry in the spare
    order too: the entry just loaded is the last spare victim, not the first."""
    ledger = EntryLedger(6)
    committed(ledger, "s1", 3, value=SPARE)
    committed(ledger, "s2", 3, value=SPARE)
    assert ledger.pin_held(["s1", "gone"]) == [True, False]
    ledger.check_integrity()  # the spare order follows the use order
    ledger.unpin_many(["s1"])
    assert ledger.reserve("new", 3, 1.0) == ["s2"]
    ledger.check_integrity()


def test_a_later_value_wins_upward_only() -> None:
    ledger = RankedLedger(6, RULE)
    committed(ledger, "a", 3, value=SPARE)
    ledger.store_again("a", 4.0)  # valued now
    assert not ledger.get("a").spare and ledger.get("a").value == 4.0  # type: ignore[union-attr]
    committed(ledger, "b", 3, value=1.0)
    used = ledger.get("b").last_used  # type: ignore[union-attr]
    ledger.store_again("b", SPARE)  # changes nothing, not even its recency
    assert ledger.get("b").value == 1.0 and ledger.get("b").last_used == used  # type: ignore[union-attr]
    assert ledger.reserve("c", 3, SPARE) is None  # both valued: no spare room
    ledger.check_integrity()


def test_integrity_catches_spare_accounting_out_of_step() -> None:
    ledger = EntryLedger(6)
    committed(ledger, "s", 3, value=SPARE)
    ledger.check_integrity()
    ledger.spare.discard("s")
    with pytest.raises(AssertionError):
        ledger.check_integrity()
    room = SpareRoom()
    room.add("k", 5)
    with pytest.raises(AssertionError):
        room.check_integrity(lambda k: 4)


def _host(budget: int) -> tuple[HostTier, list[UnitKey]]:
    fp = ModelFingerprint("w", "layout", ("uint8",), 16, ("g0",))
    spilled: list[UnitKey] = []
    tier = HostTier(fp, budget, TorchHostMemory("cpu"))
    tier.spill = lambda key, parts, value: spilled.append(key)
    return tier, spilled


def test_the_host_tier_skips_spare_stores_quietly_and_never_spills_them(caplog) -> None:  # type: ignore[no-untyped-def]
    tier, spilled = _host(8)
    part = [torch.zeros(4, dtype=torch.uint8)]
    keys = [UnitKey(bytes([i]) * 32, 0) for i in range(4)]
    assert tier.store(keys[0], part, value=2.0).wait()
    assert tier.store(keys[1], part, value=SPARE).wait()  # free bytes
    with caplog.at_level(logging.WARNING, logger="hybridkv"):
        big = [torch.zeros(8, dtype=torch.uint8)]  # the spare entry's 4 bytes are not enough
        skipped = tier.store(keys[2], big, value=SPARE)  # would evict the valued entry
        assert not skipped.wait() and isinstance(skipped.error, TierFullError)
    assert tier.stats.spare_skips == 1 and tier.stats.store_skips == 0
    assert not caplog.records  # expected, not warned
    assert tier.store(keys[3], part, value=1.0).wait()  # evicts the spare entry first...
    assert set(tier.keys()) == {keys[0], keys[3]}
    assert spilled == []  # ...which goes no lower
    tier.check_integrity()
    tier.close()
