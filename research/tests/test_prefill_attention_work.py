"""``research/prefill_attention_work.py``: the 1 x 2k prefill's programs counted by hand,
and the list scheduling on small cases worked by hand."""

from __future__ import annotations

import prefill_attention_work as paw


def test_prefill_1x2k_programs_by_hand():
    # block_m 128 = 32 tokens x 4 query heads; q block j sees keys up to 32 (j + 1): j + 1
    # tiles of 32. Grid 2048 // 32 + 1 = 65 (one q block with no token), x 8 KV heads.
    tiles, what, resident = paw.programs(paw.CASES[0])
    assert what.startswith("grid (65, 8, 1), block_m 128 (32 tokens), tile_n 32")
    assert resident == 2 and len(tiles) == 65 * 8
    assert tiles[:65] == [float(j + 1) for j in range(64)] + [0.0]  # KV head 0, q blocks
    assert tiles[65:130] == tiles[:65]  # then KV head 1
    split, _, _ = paw.programs(paw.CASES[0], 4)
    assert split[:4] == [1.0, 1.0, 1.0, 1.0] and split[63] == 16.0  # 64 tiles in 4


def test_list_scheduling_by_hand():
    # A program of t tiles takes 1 + t. Two slots, durations 4, 2, 2, 4: a ends at 4, b at
    # 2 then 4, and the last 4 starts at 4: 8.
    assert paw.makespan([3.0, 1.0, 1.0, 3.0], 2) == 8.0
    # Durations 2, 2, 2, 2, 4: a and b end at 2, then 4, and the 4 starts at 4: 8.
    # Longest first (4, 2, 2, 2, 2): a 4, b 2, 4, 6, a 6: 6, the bound (12 / 2).
    tiles = [1.0, 1.0, 1.0, 1.0, 3.0]
    assert paw.makespan(tiles, 2) == 8.0
    assert paw.makespan(paw.longest_first(tiles), 2) == 6.0 == paw.bound(tiles, 2)
    assert paw.makespan([0.0, 0.0], 1) == 0.0  # q blocks with no token take no time


def test_the_launch_order_tail_of_1x2k_and_longest_first():
    tiles, _, resident = paw.programs(paw.CASES[0])
    slots = paw.SMS * resident
    now = paw.makespan(tiles, slots) / paw.bound(tiles, slots)
    first = paw.makespan(paw.longest_first(tiles), slots) / paw.bound(tiles, slots)
    assert now > 1.5 and first < 1.01
