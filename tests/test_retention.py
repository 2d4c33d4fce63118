"""``hybridkv.managers.retention``: kept points and unit values, by hand."""

from __future__ import annotations

import pytest

from hybridkv.managers.retention import FinalPoints, UnitValues


def test_final_points_at_block_size_one() -> None:
    # Step 1 (block size 1): the point 1 is a real point, and the tail of 2 tokens
    # before 8 holds 6, 7, 8 and nothing past the end.
    fp = FinalPoints([1, 8, 9], 8, 2, 1)
    assert fp.kept == [1, 8]
    assert fp.points == [1, 6, 7, 8]
    assert FinalPoints([], 8, 2, 1).points == [6, 7, 8]


def test_unit_values_deeper_unit_worth_less() -> None:
    # 160 / (2 + 7) = 17.8; the deeper unit saves 800 - 160 = 640 tokens for
    # 8 + 40 pages = 13.3, lower, so it is its own chain value.
    points = FinalPoints([160], 800, 0, 80)
    v = UnitValues(points, {160: 2, 800: 8}, {160: 7, 800: 40})
    assert v.chain == pytest.approx({160: 160 / 9, 800: 640 / 48})


def test_unit_values_of_nothing() -> None:
    v = UnitValues(FinalPoints([], 0, 0, 4), {}, {})
    assert v.main == [] and v.chain == {}
