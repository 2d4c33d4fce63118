"""``hybridkv.managers.snapshots``: which Mamba states exist and where the runner writes them."""

from __future__ import annotations

import torch

from hybridkv.managers.snapshots import (
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
    assert snapshot_entries(8, 8, 30, caching=False, hybrid=False, **common) == []


def test_hybrid_tail_starts_at_a_hit_boundary() -> None:
    # Hit step 8 (another group's block size), block size 4: the tail of 8 tokens
    # before 30 starts at the hit boundary 16 (entry 3), not at 20 (entry 4).
    got = snapshot_entries(0, 8, 30, block_size=4, caching=True, hybrid=True, tail=8, step=8)
    assert got == [3, 4, 5, 6, 7]
    assert snapshot_entries(0, 8, 30, block_size=4, caching=True, hybrid=True, tail=8) == [
        4,
        5,
        6,
        7,
    ]


def test_save_slots() -> None:
    # Two sequences: positions 2..6 (ends a block at 3) and 7..8; block size 4.
    positions = torch.tensor([2, 3, 4, 5, 6, 7, 8])
    slots = torch.tensor([5, 5, 0, 0, 9, 0, 4])
    got = save_slots(positions, slots, torch.tensor([5, 7]), 4)
    # saves after 3 (block end, slot 5), after 6 (seq end, slot 9) and after 8
    # (seq end, slot 4); position 7 ends a block but its entry is null: no save.
    assert got.tolist() == [-1, 5, -1, -1, 9, -1, 4]
    assert got.dtype == torch.int32


def test_reserve() -> None:
    assert snapshot_reserve_blocks([80, 80], 8192) == 2 * 103
    assert snapshot_reserve_blocks([], 8192) == 0
