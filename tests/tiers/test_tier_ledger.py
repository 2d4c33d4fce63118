"""``EntryLedger``: count first, then act; use order; a ranking (``RankedLedger``); pins."""

from __future__ import annotations

from functools import partial

import pytest

from hybridkv.policy import unit_class
from hybridkv.tiers.ledger import EntryLedger
from hybridkv.tiers.ranked_ledger import RankedLedger
from hybridkv.tiers.ranking import RankRule

#: Classes of value per byte against a 4-byte page, 1 turnover per class step of 2.
RULE = RankRule(2.0, partial(unit_class, page_bytes=4))


def committed(ledger: EntryLedger, key: str, nbytes: int, value: float | None = None) -> None:
    assert ledger.reserve(key, nbytes, value) is not None
    ledger.commit(key)


def test_reserve_picks_victims_in_use_order_or_changes_nothing() -> None:
    ledger = EntryLedger(10)
    for k in "abc":
        committed(ledger, k, 3)
    ledger.touch("a")
    ledger.pin("b")
    assert ledger.reserve("d", 8) is None  # 1 free + c (3) + a (3) < 8: b is pinned
    assert ledger.committed_keys() == ["b", "c", "a"] and ledger.used_bytes == 9
    assert ledger.reserve("d", 4) == ["c"]  # 1 free + c's 3
    assert ledger.reserve("e", 11) is None  # larger than the budget
    ledger.check_integrity()


def test_a_ranking_keys_value_and_recency() -> None:
    ledger = RankedLedger(12, RULE)
    committed(ledger, "cheap", 4, value=1.0)  # class 0, key 4 / 12
    committed(ledger, "dear", 4, value=40.0)  # class 10, key 8 / 12 + 10
    committed(ledger, "none", 4)  # no value: the neutral 1.0, key 12 / 12
    assert ledger.reserve("new", 8, value=2.0) == ["cheap", "none"]
    ledger.check_integrity()


def test_uncommitted_entries_are_pinned_by_their_store() -> None:
    ledger = EntryLedger(8)
    assert ledger.reserve("a", 8) == []
    assert ledger.reserve("b", 1) is None  # a's store is in flight
    with pytest.raises(ValueError, match="no pin"):
        ledger.unpin("a")  # the store's own pin is not the caller's to undo
    ledger.commit("a")
    assert ledger.reserve("b", 1) == ["a"]
    with pytest.raises(KeyError, match="already"):
        ledger.reserve("b", 1)
    with pytest.raises(ValueError, match="budget_bytes"):
        EntryLedger(-1)


def test_integrity_catches_broken_accounting() -> None:
    ledger = EntryLedger(8)
    committed(ledger, "a", 4)
    ledger.used_bytes = 5
    with pytest.raises(AssertionError):
        ledger.check_integrity()
