"""``research/lhd_ranking.py``: the hit density, worked by hand, and the eviction order."""

from __future__ import annotations

from collections.abc import Hashable

import lhd_ranking as lhd
import pytest
from ceilings import lru_hits


def test_age_bins_are_quarter_octaves_capped():
    assert [lhd.age_bin(a) for a in (0, 1, 3, 7)] == [0, 4, 8, 12]
    assert lhd.age_bin(10**30) == lhd.NUM_BINS - 1
    assert lhd.bin_width(0) == pytest.approx(2**0.25 - 1)


def test_density_worked_by_hand():
    m = lhd.HitDensity()
    m.hit("a", 0)  # bin 0
    m.evict("a", 1, 1)  # bin 4
    m.rebuild(decay=0.5)
    w = lhd.bin_width
    # At age 1 (bin 4) nothing above it hits: 0 hits over 1 event's lifetime.
    assert m.density("a", 1) == 0.0
    # At age 0: 1 hit; the eviction's event spans bins 4..0, the hit's bin 0 alone.
    lifetime = w(4) + w(3) + w(2) + w(1) + 2 * w(0)
    assert m.density("a", 0) == pytest.approx(1 / lifetime)
    # Past the last event there is no evidence: recency.
    assert m.density("a", 100) == pytest.approx(1 / 101)
    assert m.density("unseen", 3) == pytest.approx(1 / 4)
    assert m.hits["a"][0] == 0.5 and m.evictions["a"][4] == 0.5  # decayed after the rebuild


class _Fixed(lhd.HitDensity):
    """A density by class alone, never rebuilt."""

    def __init__(self, by_class: dict[Hashable, float]) -> None:
        super().__init__()
        self.by_class = by_class

    def rebuild(self, decay: float = 1.0) -> None:
        pass

    def density(self, c: Hashable, age: int) -> float:
        return self.by_class[c]


def test_the_lowest_density_unit_goes_first_from_its_deepest_block():
    # 4-token blocks; prompts of 9 tokens hit at most 2 blocks. Pool: 4 blocks.
    keys = [[1, 2], [3, 4], [5], [1, 2], [3, 4]]
    lengths = [9, 9, 5, 9, 9]
    classes = ["keep", "drop", "drop", "keep", "drop"]
    model = _Fixed({"keep": 1.0, "drop": 0.0})
    hits = lhd.lhd_hits(keys, lengths, 4, 4, classes, model=model)
    # Request 2 overflows the pool: request 1's deepest block (4) goes, not request 0's.
    # Request 3 hits both of request 0's blocks, request 4 the head of request 1's.
    assert hits == 2 * 4 + 1 * 4
    assert model.evictions["drop"][lhd.age_bin(1)] == 1  # block 4, at age 2 - 1
    assert model.hits["keep"][lhd.age_bin(3)] == 2 and model.hits["drop"][lhd.age_bin(3)] == 1
    # Recency evicts request 0's deepest block first instead.
    assert lru_hits(keys, lengths, 4, 4) == 1 * 4 + 1 * 4


def test_without_pressure_it_hits_what_lru_hits():
    keys = [[1, 2, 3], [1, 2, 9], [4], [1, 2, 3, 7], [4, 5]]
    lengths = [13, 13, 5, 17, 9]
    classes = [0, 1, 0, 2, 1]
    assert lhd.lhd_hits(keys, lengths, 4, 100, classes) == lru_hits(keys, lengths, 4, 100) > 0
