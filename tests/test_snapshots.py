"""``hybridkv.snapshots``: which Mamba states exist and where the runner writes them."""

from __future__ import annotations

import torch

from hybridkv.snapshots import (
    resume_entry,
    save_slots,
    snapshot_entries,
    snapshot_reserve_blocks,
)


def test_resume_entry() -> None:
    assert [resume_entry(s, 4) for s in (0, 1, 4, 5, 8, 9)] == [-1, 0, 0, 1, 1, 2]


def test_entries_per_policy() -> None:
    # 30 tokens at block size 4: 8 entries; 2 exist already.
    common = dict(block_size=4, kept=(12,), tail=8)
    assert snapshot_entries(2, 8, 30, caching=False, hybrid=False, **common) == [7]
    assert snapshot_entries(2, 8, 30, caching=True, hybrid=False, **common) == [2, 3, 4, 5, 6, 7]
    # hybrid: running state 7, tail boundaries from (30 - 8) // 4 - 1 = 4 to 30 // 4 = 7
    # (exclusive), and the kept point 12 (entry 2).
    assert snapshot_entries(2, 8, 30, caching=True, hybrid=True, **common) == [2, 4, 5, 6, 7]
    assert snapshot_entries(8, 8, 30, caching=True, hybrid=True, **common) == []


def test_save_slots() -> None:
    # Two sequences: positions 2..6 (ends a block at 3) and 7..8; block size 4.
    positions = torch.tensor([2, 3, 4, 5, 6, 7, 8])
    slots = torch.tensor([5, 5, 0, 0, 9, 3, 4])  # entry of position 4-6 null, except...
    got = save_slots(positions, slots, torch.tensor([5, 7]), 4)
    # saves after 3 (block end, slot 5), after 6 (seq end, slot 9), after 7
    # (block end, slot 3) and after 8 (seq end, slot 4); nothing where the slot is null.
    assert got.tolist() == [-1, 5, -1, -1, 9, 3, 4]
    assert got.dtype == torch.int32


def test_reserve() -> None:
    assert snapshot_reserve_blocks([80, 80], 8192) == 2 * 103
    assert snapshot_reserve_blocks([], 8192) == 0
