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

from collections.abc import Callable, Sequence

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

    __slots__ = ("end", "kept", "step", "tail_lo")

    def __init__(self, kept: Sequence[int], end: int, tail: int, step: int) -> None:
        self.kept = sorted(p for p in kept if 0 < p <= end)
        self.end = end
        self.step = step
        self.tail_lo = max(step, -(-(end - tail) // step) * step)

    def _tail_from(self, pos: int) -> int | None:
        """The smallest tail point >= ``pos``, if any."""
        p = max(pos, self.tail_lo)
        p = -(-p // self.step) * self.step
        return p if p <= self.end else None

    def covering(self, index: int, first_needed_block: Callable[[int], int], bs: int) -> int | None:
        """The smallest kept point whose hit needs block ``index`` (None: none)."""
        best = covering_point(self.kept, index, first_needed_block, bs)
        p = self._tail_from((index + 1) * bs)
        if p is not None and first_needed_block(p) <= index and (best is None or p < best):
            best = p
        return best

    def full_unit(self, index: int, bs: int) -> int:
        """The smallest kept point that needs full-attention block ``index``."""
        end = (index + 1) * bs
        best = next((p for p in self.kept if p >= end), BEYOND)
        p = self._tail_from(end)
        return best if p is None else min(best, p)


def release_order(
    entries: list[tuple[int, int, int, KVCacheBlock]],
) -> list[KVCacheBlock]:
    """Blocks in release order from ``(unit point, end position, group, block)``.

    Largest unit first, within a unit the deepest position first: the free
    queue then evicts a whole hit unit, deepest first, before the next.
    """
    entries.sort(key=lambda e: (-e[0], -e[1], e[2]))
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
