"""``EntryLedger``: count first, then act; use order; a ranking; pins."""

from __future__ import annotations

import pytest

from hybridkv.tiers.ledger import EntryLedger, value_per_byte


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


def test_a_ranking_goes_first_then_use_order() -> None:
    ledger = EntryLedger(12, ranking=value_per_byte)
    committed(ledger, "cheap", 4, value=1.0)
    committed(ledger, "dear", 4, value=40.0)
    committed(ledger, "none", 4)  # no value ranks 0: first out
    assert ledger.reserve("new", 8, value=2.0) == ["none", "cheap"]
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
