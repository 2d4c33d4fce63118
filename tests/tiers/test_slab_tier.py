"""``HostTier`` over a ``SlabMemory``: one slot per entry, batches of units as rows
(``store_rows`` / ``load_rows``): round trips, the budget in slots, entries in
flight, failed copies, and the per-entry API on the same slots."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tier_factories import GateCopier, fingerprint, key

from hybridkv.tiers import HostTier, TierFullError, UnitKey
from hybridkv.tiers.copier import InlineCopier
from hybridkv.tiers.rows import Rows
from hybridkv.tiers.slab_memory import SlabMemory
from hybridkv.tiers.torch_memory import TorchHostMemory

WIDTHS = (48, 32)


def device(blocks: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two 'layers' of a device pool: ``[blocks, width]`` rows of random bytes."""
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, 256, (blocks, w), dtype=np.uint8) for w in WIDTHS)  # type: ignore[return-value]


def tier(slots: int, copier: Any = None) -> HostTier:
    memory = SlabMemory(WIDTHS, slots * sum(WIDTHS))
    return HostTier(fingerprint(), slots * sum(WIDTHS), memory, copier=copier or InlineCopier())


def keys(*ids: int) -> list[UnitKey]:
    return [key(i) for i in ids]


def test_a_batch_round_trips_through_one_transfer() -> None:
    dev = device()
    t = tier(8)
    ((stored, skipped),) = t.store_rows([(keys(1, 2, 3), Rows(dev, [5, 9, 2]), [1.0] * 3)])
    assert stored.wait() and not skipped and stored.keys == tuple(keys(1, 2, 3))
    assert all(t.contains(k) for k in keys(1, 2, 3)) and t.used_bytes == 3 * sum(WIDTHS)
    other = tuple(np.zeros_like(a) for a in dev)
    (loaded,) = t.load_rows([(keys(3, 1), Rows(other, [0, 7]))])
    assert loaded.wait()
    for a, b in zip(other, dev, strict=True):
        np.testing.assert_array_equal(a[[0, 7]], b[[2, 5]])
        assert not a[1:7].any()  # nothing else written
    single = t.load(key(2))  # the per-entry API reads the same slot
    assert single is not None and single.wait()
    assert [bytes(p) for p in single.result] == [bytes(a[9]) for a in dev]
    assert t.stats.stores == 3 and t.stats.loads == 3
    assert (t.copies.store.calls, t.copies.load.calls) == (1, 1)
    assert t.copies.load.bytes == 2 * sum(WIDTHS)
    t.check_integrity()
    t.close()


def test_narrower_rows_use_the_front_of_each_slot() -> None:
    dev = device()
    narrow = tuple(np.ascontiguousarray(a[:, :20]) for a in dev)
    t = tier(4)
    ((stored, _),) = t.store_rows([(keys(1), Rows(narrow, [3]), [None])])
    assert stored.wait() and t.used_bytes == sum(WIDTHS)  # a whole slot
    back = t.load(key(1))
    assert back is not None and back.wait()
    assert [bytes(p) for p in back.result] == [bytes(a[3]) for a in narrow]
    with pytest.raises(ValueError, match="parts of"):
        t.load_rows([(keys(1), Rows(dev, [0]))])  # the entry's parts are 20 bytes
    t.check_integrity()


def test_the_budget_is_counted_in_slots_and_a_batch_never_evicts_itself() -> None:
    dev = device()
    t = tier(3)
    ((stored, skipped),) = t.store_rows([(keys(1, 2, 3, 4, 5), Rows(dev, range(5)), [1.0] * 5)])
    assert stored.wait() and stored.keys == tuple(keys(1, 2, 3))
    assert [k for k, _ in skipped] == [3, 4]
    assert all(isinstance(e, TierFullError) for _, e in skipped)
    assert t.stats.store_skips == 2
    # A later batch evicts the least recently used; a key already held is only touched.
    ((again, _),) = t.store_rows([(keys(1, 6), Rows(dev, [0, 6]), [1.0, 1.0])])
    assert again.wait() and again.keys == (key(6),)
    assert sorted(t.keys()) == sorted(keys(1, 3, 6))  # 2 was the least recently used
    assert t.held_bytes <= t.budget_bytes
    t.check_integrity()


def test_entries_in_flight_are_pinned_and_not_served() -> None:
    dev = device()
    gate = GateCopier()
    t = tier(4, gate)
    ((stored, _),) = t.store_rows([(keys(1, 2), Rows(dev, [0, 1]), [1.0, 1.0])])
    assert not stored.done() and not t.contains(key(1)) and not t.evict(key(1))
    t.check_integrity()  # the transfer's keys hold the pins
    gate.run()
    assert stored.done() and t.contains(key(1))
    (loaded,) = t.load_rows([(keys(1, 2), Rows(tuple(np.zeros_like(a) for a in dev), [3, 4]))])
    assert not loaded.done() and not t.evict(key(2))
    t.check_integrity()
    gate.run()
    assert loaded.wait() and t.evict(key(2))
    t.check_integrity()


def test_a_failed_batch_keeps_nothing_and_unpins() -> None:
    dev = device()
    gate = GateCopier()
    t = tier(4, gate)
    ((stored, _),) = t.store_rows([(keys(1, 2), Rows(dev, [0, 1]), [1.0, 1.0])])
    gate.jobs = [(f, _fail, ()) for f, _, _ in gate.jobs]
    gate.run()
    assert not stored.wait() and t.used_bytes == 0 and t.stats.store_failures == 2
    ((ok, _),) = t.store_rows([(keys(3), Rows(dev, [2]), [1.0])])
    gate.run()
    assert ok.wait()
    (loaded,) = t.load_rows([(keys(3), Rows(dev, [5]))])
    gate.jobs = [(f, _fail, ()) for f, _, _ in gate.jobs]
    gate.run()
    assert not loaded.wait() and t.stats.load_failures == 1 and t.evict(key(3))
    t.check_integrity()


def _fail() -> None:
    raise OSError("injected copy failure")


def test_a_load_of_a_missing_key_pins_nothing() -> None:
    dev = device()
    t = tier(4)
    ((stored, _),) = t.store_rows([(keys(1), Rows(dev, [0]), [1.0])])
    assert stored.wait()
    with pytest.raises(KeyError, match="lacks it"):
        t.load_rows([(keys(1, 2), Rows(dev, [3, 4]))])
    assert t.evict(key(1))  # not pinned
    t.check_integrity()


def test_per_entry_stores_fill_slots_too() -> None:
    t = tier(2)
    assert t.store(key(1), [bytes(range(48)), b"x" * 32]).wait()
    assert t.used_bytes == sum(WIDTHS)
    out = tuple(np.zeros((2, w), np.uint8) for w in WIDTHS)
    (loaded,) = t.load_rows([(keys(1), Rows(out, [1]))])
    assert loaded.wait() and bytes(out[0][1]) == bytes(range(48)) and bytes(out[1][1]) == b"x" * 32
    with pytest.raises(ValueError, match="the slot holds 32"):
        t.store(key(2), [b"", b"y" * 33])
    t.check_integrity()


def test_row_batches_need_a_slab() -> None:
    t = HostTier(fingerprint(), 1 << 10, TorchHostMemory("cpu"), copier=InlineCopier())
    assert not t.takes_rows
    with pytest.raises(ValueError, match="SlabMemory"):
        t.load_rows([(keys(1), Rows(device(), [0]))])


def test_a_pin_batch_is_taken_over_by_its_load() -> None:
    """``pin_batch`` pins what the tier holds (one pin each, checked by
    ``check_integrity``); a ``load_rows(pins=)`` of exactly those keys takes the
    pins over and releases them as it settles; any other use is refused."""
    dev = device()
    gate = GateCopier()
    t = tier(4, gate)
    ((stored, _),) = t.store_rows([(keys(1, 2), Rows(dev, [0, 1]), [1.0, 1.0])])
    gate.run()
    assert stored.wait()
    batch = t.pin_batch(keys(2, 7, 1))
    assert batch.held == [True, False, True] and batch.keys == keys(2, 1)
    assert not t.evict(key(1))  # pinned
    t.check_integrity()
    out = tuple(np.zeros_like(a) for a in dev)
    with pytest.raises(ValueError, match="exactly the keys"):
        t.load_rows([(keys(1), Rows(out, [3]))], pins=batch)
    (loaded,) = t.load_rows([(keys(1, 2), Rows(out, [3, 4]))], pins=batch)
    assert batch.released and not t.evict(key(1))  # the transfer holds the pin now
    t.check_integrity()
    with pytest.raises(ValueError, match="does not hold"):
        t.unpin_batch(batch)  # taken over: nothing to undo
    gate.run()
    assert loaded.wait() and t.evict(key(1)) and t.evict(key(2))
    for a, b in zip(out, dev, strict=True):
        np.testing.assert_array_equal(a[[3, 4]], b[[0, 1]])
    again = t.pin_batch(keys(3))
    assert again.keys == [] and again.held == [False]
    t.unpin_batch(again)
    t.check_integrity()


def test_a_load_in_its_pin_batchs_order_reads_and_unpins_the_pinned_entries() -> None:
    """A ``load_rows(pins=)`` whose batches list the pinned keys in the pin batch's
    order reads each slot off the pinned ledger entries (``EntryInfo.where``) and
    its settling unpins those entries: every batch lands its own units, and once
    they settle no pin is left (``check_integrity`` counts them); a stale
    ``where`` is an integrity failure."""
    dev = device()
    gate = GateCopier()
    t = tier(6, gate)
    ((stored, _),) = t.store_rows([(keys(1, 2, 3, 4), Rows(dev, [5, 1, 9, 2]), [1.0] * 4)])
    gate.run()
    assert stored.wait()
    batch = t.pin_batch(keys(1, 2, 3, 4))
    assert batch.keys == keys(1, 2, 3, 4) and len(batch.entries) == 4
    out = tuple(np.zeros_like(a) for a in dev)
    loads = t.load_rows(
        [(keys(1, 2), Rows(out, [7, 0])), (keys(3, 4), Rows(out, [4, 3]))], pins=batch
    )
    assert batch.released and not t.evict(key(3))  # its transfer holds the pin
    t.check_integrity()
    gate.run()
    assert all(ld.wait() for ld in loads)
    for a, b in zip(out, dev, strict=True):
        np.testing.assert_array_equal(a[[7, 0, 4, 3]], b[[5, 1, 9, 2]])
    t.check_integrity()  # no pin left
    entry = t._ledger.get(key(2))
    assert entry is not None
    entry.where = t._ledger.get(key(1)).where  # type: ignore[union-attr]
    with pytest.raises(AssertionError, match="where stale"):
        t.check_integrity()
    t.close()


@pytest.mark.parametrize("copy", ["native", "numpy"])
def test_a_batch_round_trips_exactly_under_either_row_copy(copy: str) -> None:
    """The same batches stored and loaded with the native row copy and with numpy's:
    the same bytes land, and ``copies.row_copy`` says which copy ran."""
    from hybridkv.kernels.cpu import ffi, native_status
    from hybridkv.tiers.row_copy import NativeRowCopy, NumpyRowCopy

    if copy == "native" and native_status() is not None:
        pytest.skip(f"the native row copy cannot be built here: {native_status()}")
    chosen = NativeRowCopy(ffi.c_fn("hkv_copy_rows")) if copy == "native" else NumpyRowCopy()
    memory = SlabMemory(WIDTHS, 8 * sum(WIDTHS), chosen)
    t = HostTier(fingerprint(), 8 * sum(WIDTHS), memory, copier=InlineCopier())
    assert t.copies.row_copy == copy
    dev = device(seed=3)
    ((stored, _),) = t.store_rows([(keys(1, 2, 3, 4), Rows(dev, [7, 0, 15, 8]), [1.0] * 4)])
    assert stored.wait()
    other = tuple(np.zeros_like(a) for a in dev)
    loaded = t.load_rows([(keys(4, 1), Rows(other, [3, 2])), (keys(2, 3), Rows(other, [9, 1]))])
    assert all(x.wait() for x in loaded)
    for a, b in zip(other, dev, strict=True):
        np.testing.assert_array_equal(a[[3, 2, 9, 1]], b[[8, 7, 0, 15]])
        assert not a[[0, *range(4, 9), *range(10, 16)]].any()
    t.check_integrity()
    t.close()
