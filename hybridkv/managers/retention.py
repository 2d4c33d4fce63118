"""The ``hybrid`` cache policy: keep only what a later hit can use.

Under ``lru`` every computed block is cached, and LRU treats a sliding-window
block far behind the window, or a Mamba state at a boundary nobody will
resume from, exactly like a full-attention block. A hit at ``L`` needs, per
group, only the blocks from ``first_needed(L)`` to ``L`` (``get_num_skipped_tokens``).
``hybrid`` fixes, per request, a few *kept points* where a later request can
resume, and keeps each non-full group's blocks only where a kept point needs
them:

- ``H``: the prefix hit the request was admitted with (another request's
  kept point: keep it alive);
- ``F``: the branch point, when the full-attention groups matched further
  than the common hit (``F > H``): the request diverges there from something
  cached, so later requests with the same prefix will too (Marconi's idea);
- ``E``: the end of what the request computed, aligned down to the block
  size (taken when it is freed). Running requests hold the blocks of the last
  block boundary (one extra block per group at most) so that ``E`` is whole.

Blocks of a non-full group that no kept point needs are released *evict
first* (the head of the free queue). Mamba groups get real state blocks only
at kept points, the last boundary and the running state: the other boundary
entries a prefill crosses stay null, so nothing is written or reserved there.

At ``free`` the rest is released unit by unit, largest kept point first: the
blocks only ``E`` needs (its window, its state, the full blocks after the
previous kept point), then those of the next kept point down, so the free
queue evicts whole hit units, deepest first, and a kept point's window never
outlives the full-attention prefix it needs (nor the reverse).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from operator import itemgetter

from hybridkv.core.block import KVCacheBlock

#: Sort key for blocks that no kept point covers (released first).
BEYOND = 1 << 62
#: The tail: a freed request keeps a hit point at every block boundary of its
#: last 512 tokens, not only at its end. A follow-up request rarely repeats a
#: finished one token for token up to its end (chat templates re-render the
#: end of a turn; traces such as Mooncake's share prefixes in 512-token
#: units), so it diverges a little before ``E``. Costs ``512 / block_size``
#: blocks per sliding group and ``512 / block_size`` states per Mamba group.
TAIL_TOKENS = 512


def needed_range(first_needed_block: Callable[[int], int], point: int, bs: int) -> range:
    """Block indices a hit at ``point`` tokens needs in a group."""
    return range(first_needed_block(point), point // bs)


def covering_point(
    kept: Sequence[int], index: int, first_needed_block: Callable[[int], int], bs: int
) -> int | None:
    """The smallest kept point whose hit needs block ``index``; None if none does.

    ``kept`` is sorted ascending.
    """
    for p in kept:
        if first_needed_block(p) <= index < p // bs:
            return p
    return None


class FinalPoints:
    """A freed request's kept points: its own (``kept``) and every multiple of
    ``step`` in ``[end - tail, end]`` (the tail, see ``TAIL_TOKENS``)."""

    __slots__ = ("kept", "points")

    def __init__(self, kept: Sequence[int], end: int, tail: int, step: int) -> None:
        self.kept = sorted(p for p in kept if 0 < p <= end)
        tail_lo = max(step, -(-(end - tail) // step) * step)
        #: All of them, tail included, ascending (``unit_of`` runs per block).
        self.points = sorted({*self.kept, *range(tail_lo, end + 1, step)})

    def unit_of(
        self, first_needed_block: Callable[[int], int] | None, bs: int
    ) -> Callable[[int], int]:
        """One group's ``index -> unit``: the smallest point whose hit needs
        block ``index`` (``BEYOND``: none). ``first_needed_block`` is None for
        full attention, whose blocks every point at or past their end needs.

        Only the smallest point past the block can need it: a larger one reads
        no earlier block (``first_needed_block`` is non-decreasing).
        """
        points = self.points
        n = len(points)

        def full(index: int) -> int:
            k = bisect_left(points, (index + 1) * bs)
            return points[k] if k < n else BEYOND

        if first_needed_block is None:
            return full
        first = first_needed_block

        def cover(index: int) -> int:
            k = bisect_left(points, (index + 1) * bs)
            return points[k] if k < n and first(points[k]) <= index else BEYOND

        return cover


def release_order(
    entries: list[tuple[int, int, int, KVCacheBlock]],
) -> list[KVCacheBlock]:
    """Blocks in release order from ``(unit point, end position, group, block)``.

    Largest unit first, within a unit the deepest position first (then the
    lowest group): the free queue then evicts a whole hit unit, deepest first,
    before the next.
    """
    # Two stable sorts with C keys (``reverse`` keeps equal keys in order); the
    # first is a linear pass when entries come group by group.
    entries.sort(key=itemgetter(2))
    entries.sort(key=itemgetter(0, 1), reverse=True)
    return [e[3] for e in entries]


def mamba_real_entries(
    have: int,
    required: int,
    num_tokens: int,
    kept: Sequence[int],
    bs: int,
    tail: int,
    step: int,
) -> list[int]:
    """Mamba table entries in ``[have, required)`` that get a real state block.

    The running state (``required - 1``), the boundaries from the last hit
    boundary (a multiple of ``step``) at or before ``num_tokens - tail`` up to
    ``num_tokens`` and the entries of kept points; every other boundary the
    step crosses stays null (not written, not reserved).
    """
    real = {required - 1}
    real.update(range(max(have, (num_tokens - tail) // step * step // bs - 1), num_tokens // bs))
    real.update(p // bs - 1 for p in kept)
    return sorted(j for j in real if have <= j < required)
