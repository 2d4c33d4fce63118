"""Hit points as geometry: which table ranges a point's hit needs, which
boundaries lie on a branch grid, which boundaries a tail holds.

Pure functions of positions, shared by the managers (what a running request
holds), the Mamba snapshots (which states exist) and the ``hybrid`` policy
(``hybridkv.policy``), which decides where the points are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise


def on_grid(point: int, align: int, step: int, limit: int | None = None) -> bool:
    """True when a hit at boundary ``point`` (a multiple of ``step``) can
    serve a branch at a multiple of ``align`` (``0``: any point can); with
    ``limit``, a branch at or below it (a request sharing at most the ``limit``
    tokens of the one that kept ``point``)."""
    if align == 0:
        return True
    gap = -point % align
    return gap < step and (limit is None or gap <= limit - point)


def tail_points(end: int, tail: int, step: int, align: int) -> list[int]:
    """The tail's hit points of a request whose last hit boundary is ``end``
    (a multiple of ``step``), ascending.

    Dense (``align == 0``): every multiple of ``step`` in ``[end - tail, end]``
    (none below ``step``). Aligned: the multiples of ``step`` from the one at
    or below ``end - tail`` up to ``end`` that are ``on_grid``, and ``end``.
    """
    if not align:
        return list(range(max(step, -(-(end - tail) // step) * step), end + 1, step))
    lo = max(step, (end - tail) // step * step)  # a grid point may sit below ``end - tail``
    if lo > end:
        return []
    if align <= step:  # every boundary is within a step below a grid multiple (on_grid)
        return list(range(lo, end + 1, step))
    # On the grid: the last boundary at or below each multiple of ``align``
    # (one per multiple, as ``align > step``), from ``lo`` up to ``end``.
    out = [k * align // step * step for k in range(-(-lo // align), (end + step - 1) // align + 1)]
    if not out or out[-1] != end:
        out.append(end)
    return out


def kept_spans(
    kept: Sequence[int], first_needed_block: Callable[[int], int], bs: int
) -> tuple[tuple[int, int], ...]:
    """For each kept point, the block indices ``[lo, hi)`` its hit needs.

    A block is kept when an index range holds it (``in_spans``).
    """
    return tuple((first_needed_block(p), p // bs) for p in kept)


def in_spans(spans: Sequence[tuple[int, int]], index: int) -> bool:
    """True when some kept point's hit needs block ``index``."""
    return any(lo <= index < hi for lo, hi in spans)


def segments(
    spans: Sequence[tuple[int, int]], start: int, stop: int
) -> list[tuple[int, int, bool]]:
    """``[start, stop)`` cut into ascending ``(lo, hi, kept)`` ranges:
    ``kept`` is ``in_spans`` of every index in the range (one test per range,
    not per block)."""
    if not spans and start < stop:  # no kept point (``lru``, or none kept): one range
        return [(start, stop, False)]
    cuts = {start, stop}
    for lo, hi in spans:
        if lo < stop and hi > start:
            cuts.add(max(lo, start))
            cuts.add(min(hi, stop))
    edges = sorted(cuts)
    return [(a, b, in_spans(spans, a)) for a, b in pairwise(edges)]


@dataclass(frozen=True, slots=True)
class Hold:
    """What a group's running requests hold beyond what their next query reads
    (a cache policy's, given to the manager when it is built).

    ``tail``: tokens before the computed end whose last hit boundary stays
    whole (its blocks are released only once the query passes it by
    ``tail``); ``step``: hit lengths are multiples of this (every group's
    block size). Blocks a request's kept points need are retained until it is
    freed; the others are released evict-first.
    """

    tail: int
    step: int
