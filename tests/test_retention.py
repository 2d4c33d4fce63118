"""``hybridkv.policy.retention``: kept points and unit values, by hand."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.managers.points import in_spans, segments
from hybridkv.policy.release import charged_pages
from hybridkv.policy.retention import (
    BEYOND,
    FinalPoints,
    UnitValues,
    release_order,
)


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


def test_spans_by_hand() -> None:
    # Points 32 and 64, block size 16, a window needing blocks from (p - 16) // 16:
    # block 0 is no point's (BEYOND), 1 is 32's, 2 is BEYOND (64 needs 3 only),
    # 3 is 64's, 4-5 are past every point.
    fp = FinalPoints([32, 64], 64, 0, 16)
    assert fp.spans(lambda p: (p - 16) // 16, 16, 0, 6) == [
        (0, 1, BEYOND),
        (1, 2, 32),
        (2, 3, BEYOND),
        (3, 4, 64),
        (4, 6, BEYOND),
    ]
    assert fp.spans(None, 16, 1, 3) == [(1, 2, 32), (2, 3, 64)]


@settings(max_examples=300, deadline=None)
@given(
    kept=st.lists(st.integers(1, 400), max_size=6),
    end=st.integers(0, 400),
    tail=st.sampled_from([0, 16, 48]),
    step=st.sampled_from([1, 4, 16]),
    bs=st.sampled_from([1, 2, 4, 16]),
    window=st.one_of(st.none(), st.integers(1, 64)),
    start=st.integers(0, 30),
    length=st.integers(0, 40),
)
def test_spans_match_unit_of(
    kept: list[int],
    end: int,
    tail: int,
    step: int,
    bs: int,
    window: int | None,
    start: int,
    length: int,
) -> None:
    """``spans`` is ``unit_of`` evaluated per block, as index ranges."""
    fp = FinalPoints(kept, end, tail, step)

    def first(p: int) -> int:
        assert window is not None
        return max(0, p - window) // bs

    first_needed = None if window is None else first
    unit_of = fp.unit_of(first_needed, bs)
    spans = fp.spans(first_needed, bs, start, start + length)
    flat = [(i, unit) for lo, hi, unit in spans for i in range(lo, hi)]
    assert flat == [(i, unit_of(i)) for i in range(start, start + length)]
    assert all(lo < hi for lo, hi, _ in spans)


def test_in_spans_is_half_open() -> None:
    assert in_spans(((2, 4),), 2) and in_spans(((2, 4),), 3)
    assert not in_spans(((2, 4),), 4) and not in_spans(((2, 4),), 1)


@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), max_size=5),
    st.integers(0, 40),
    st.integers(1, 30),
)
@settings(max_examples=300, deadline=None)
def test_segments_cut_the_range_by_span_membership(
    raw: list[tuple[int, int]], start: int, length: int
) -> None:
    spans = [(lo, lo + width) for lo, width in raw]
    stop = start + length
    segs = segments(spans, start, stop)
    flat = [(i, kept) for lo, hi, kept in segs for i in range(lo, hi)]
    assert flat == [(i, in_spans(spans, i)) for i in range(start, stop)]
    # As few ranges as the cuts allow: two neighbours differ or a span edge divides them.
    edges = {e for lo, hi in spans for e in (lo, hi)}
    assert all(a[2] != b[2] or a[1] in edges for a, b in itertools.pairwise(segs))


def test_segments_example() -> None:
    assert segments([(2, 4), (6, 9)], 0, 8) == [
        (0, 2, False),
        (2, 4, True),
        (4, 6, False),
        (6, 8, True),
    ]
    assert segments([(2, 4)], 5, 7) == [(5, 7, False)]


def test_blocks_no_point_needs_are_released_first() -> None:
    # BEYOND sorts above every real point: those blocks lead the release order.
    entries = [(32, 32, 0, "kept"), (BEYOND, 48, 0, "beyond"), (64, 64, 0, "deep")]
    assert [e[3] for e in release_order(entries)] == ["beyond", "deep", "kept"]


def test_aligned_tail_stops_at_the_end() -> None:
    # Step 1, grid 2, end 7, tail 4: the grid points 4 and 6 and the end; never 8.
    assert FinalPoints([], 7, 4, 1, align=2).points == [4, 6, 7]


def test_charged_pages_only_where_a_tail_point_nests_in_its_owner() -> None:
    """``charge_tail_pages``: a chunk's blocks of a tail point go to the main
    point above it (same chunk start); a window's, main points' own and those
    past every main point do not."""

    def chunk(p: int) -> int:  # 16-token chunks, 2-token blocks
        return p // 16 * 16 // 2

    def window(p: int) -> int:  # an 8-token window, 2-token blocks
        return max(0, p - 8) // 2

    pieces = [
        (8, 9, 18, chunk),  # tail point 18 below main 20, one chunk: charged
        (5, 9, 18, window),  # a window reaches past 20's: not charged
        (4, 5, 10, chunk),  # a main point's own unit: not charged
        (12, 13, 26, chunk),  # past every main point: not charged
        (0, 3, 6, chunk),  # tail point 6 below main 10, chunk start 0 both: charged
    ]
    assert charged_pages([10, 20], pieces) == {20: 1, 10: 3}
