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
- ``P``: the end of its prompt, aligned down to a hit boundary (on the
  tail's grid when one is in force: ``prompt_point``), where another sample of
  the prompt resumes, as vLLM's Mamba align mode does;
- ``E``: the end of what the request computed, aligned down to the block
  size (taken when it is freed), with its *tail*: every hit boundary of its
  last ``tail_tokens`` (``HybridTuning``), since a follow-up rarely repeats a
  finished request token for token up to its end (chat templates re-render
  the end of a turn); with a learned grid (``tail_alignment``) only the
  grid's points and ``E``. Running requests hold what the last hit
  boundary below their tail needs, so that ``E`` and the tail are whole;
  where every other group is chunked too, chunked groups hold no tail, so
  only their current chunk (a hit at its start needs none of the chunk
  before; ``KVCacheCoordinator.__init__``).

A running request *retains* the blocks its kept points need once its window
has passed them. When a step would not fit, the newest request that retains
any gives those points up before the step fails
(``hybridkv.policy.shedding``).

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
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from hybridkv.managers.points import on_grid, tail_points
from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning

#: Sort key for blocks that no kept point covers (released first).
BEYOND = 1 << 62


def prompt_point(num_prompt_tokens: int, step: int, align: int, fine: int = 0) -> int:
    """``P``, a request's prompt-end kept point: the last multiple of ``step`` at
    or below the prompt's last multiple of the branch grid (``align``, a coarse
    grid of ``tail_alignment``, else ``fine``, one no coarser than the
    full-attention block, ``fine_alignment``; with neither, every token): where
    a request that shares the prompt up to there resumes.

    Another sample of the same prompt, or a next turn that shares the prompt
    but not this answer (the Mooncake traces' expansion: a next turn shares the
    prompt's whole 512-token units, so it diverges at the last multiple of 512
    in it), resumes there; ``E``'s tail covers it only while the output is
    shorter than the tail. (A grid point past the prompt's end is no branch a
    next turn can take: Jamba's 1,000-token prompt resumes at 480, below 512, not
    at 960, below 1,024.)
    """
    grid = align or fine or 1
    last = num_prompt_tokens - num_prompt_tokens % grid
    return last - last % step


def _point_cost(
    groups: Sequence[tuple[bool, int, Callable[[int], int]]], pages: list[list[int]]
) -> float:
    """What a hit point holds outside full attention, in full-attention tokens (its
    pages over full attention's pages per token; 0: nothing, or no full attention),
    from the pages ``_point_pages`` found.

    ``groups``: ``(has_skips, block_size, first_needed_block)`` per group. A
    point's extra pages are averaged over the positions of a window or chunk far
    from the start.
    """
    full_pages_per_token = sum(1 / bs for skips, bs, _ in groups if not skips)
    if not full_pages_per_token:
        return 0.0
    return sum(sum(n) / len(n) for n in pages) / full_pages_per_token


def _point_pages(
    groups: Sequence[tuple[bool, int, Callable[[int], int]]], lcm: int
) -> list[list[int]]:
    """Per skipping group, the pages a hit point needs at 1,024 places far from the start."""
    base = lcm << 20
    samples = range(base, base + 1024 * lcm, lcm)
    return [[p // bs - first(p) for p in samples] for skips, bs, first in groups if skips]


def floor_spacing(
    groups: Sequence[tuple[bool, int, Callable[[int], int]]],
    lcm: int,
    tuning: HybridTuning = DEFAULT_TUNING,
) -> int:
    """Tokens between two snapshot floor points (0: no floor), a multiple of
    ``lcm``: ``floor_ratio`` x a point's cost (``_point_cost``), at most
    ``floor_max_state_tokens`` with a Mamba state group, else at most
    ``floor_max_window_tokens`` when every other group is a window
    (``HybridTuning``). The floor lets the *second* request sharing a prefix
    resume near the branch point, at about ``1 / floor_ratio`` of the
    full-attention memory it rides on. Chunked groups are never capped: their
    chunk starts are free points, or a floor point costs a part of a chunk
    that varies with its place.

    ``groups`` as for ``_point_cost``; layouts without full attention get
    no floor. A state group is one whose hit point needs one block of its own, a
    window one whose point needs the same number of blocks wherever it falls (a
    chunk's varies). The spacing is fixed: a learner that moved it with the
    traffic earned its place on one workload of four and was removed
    (``benchmarks/results/policy-ablation.md``).
    """
    pages = _point_pages(groups, lcm)
    cost = _point_cost(groups, pages)
    if not cost:
        return 0
    spacing = tuning.floor_ratio * cost
    if any(n[0] == 1 and len(set(n)) == 1 for n in pages):  # a full group needs them all
        spacing = min(spacing, tuning.floor_max_state_tokens)
    elif all(len(set(n)) == 1 for n in pages):
        spacing = min(spacing, tuning.floor_max_window_tokens)
    return lcm * -(-int(spacing) // lcm)


class FinalPoints:
    """A freed request's kept points: its own (``kept``) and its tail
    (``tail_alignment.tail_points``: every multiple of ``step`` in
    ``[end - tail, end]``, ``HybridTuning.tail_tokens``).

    With ``align`` (``tail_alignment``), the tail keeps only ``end`` and the
    multiples of ``step`` that are ``on_grid``; the highest of those is the
    *aligned end* (``top``, a main point of ``UnitValues``; ``end`` when there
    is none). ``num_tokens``: the request's computed tokens (``None``:
    unknown); an ``end`` whose grid multiple lies past them is off the grid
    (Jamba: a request of 1,000 tokens ends at 960, and 1,024 is no branch a
    request sharing its tokens can take).

    ``free_period``: hits at its multiples need nothing outside full attention
    (chunk boundaries when every other group is chunked; 0: none). Those up
    to ``end`` are kept points (*free points*): they hold no block of their own.
    """

    __slots__ = (
        "align",
        "end",
        "free_period",
        "kept",
        "points",
        "step",
        "tail",
        "top",
    )

    def __init__(
        self,
        kept: Sequence[int],
        end: int,
        tail: int,
        step: int,
        align: int = 0,
        free_period: int = 0,
        num_tokens: int | None = None,
    ) -> None:
        own = {p for p in kept if 0 < p <= end}
        if free_period:
            own.update(range(free_period, end + 1, free_period))
        self.kept = sorted(own)
        self.free_period = free_period
        self.end = end
        self.step = step
        self.align = align
        #: The tail's points, ascending (``tail_points``).
        self.tail = tail_points(end, tail, step, align)
        #: The aligned end (``end`` in a dense tail, or when no grid point is in the tail).
        self.top = end
        if len(self.tail) > 1 and not on_grid(end, align, step, num_tokens):  # dense: all on grid
            self.top = self.tail[-2]
        #: All of them, tail included, ascending (``unit_of`` runs per block).
        self.points = sorted({*self.kept, *self.tail})

    def is_free(self, point: int) -> bool:
        """True when a hit at ``point`` needs nothing outside full attention."""
        return bool(self.free_period) and point % self.free_period == 0

    def saved_by(self, point: int) -> int:
        """Tokens a hit loses when tail point ``point``'s own state goes.

        Dense tail: ``tail_tokens_saved`` (thinned level by level). Aligned
        tail: the hit falls to the next point below (0 if none).
        """
        if not self.align:
            return tail_tokens_saved(self.end, point, self.step)
        k = bisect_left(self.points, point)
        return point - (self.points[k - 1] if k else 0)

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

    def spans(
        self, first_needed_block: Callable[[int], int] | None, bs: int, start: int, stop: int
    ) -> list[tuple[int, int, int]]:
        """``unit_of`` over the table indices ``[start, stop)`` as ascending
        ``(lo, hi, unit)`` index ranges, computed per point, not per block.

        Point ``p`` is the smallest point past block ``i`` exactly when
        ``prev // bs <= i < p // bs`` (``prev``: the point below ``p``); a
        non-full group's blocks there before ``first_needed_block(p)`` are
        ``BEYOND``, as is everything past the last point.
        """
        out: list[tuple[int, int, int]] = []
        lo = start
        for p in self.points:
            hi = p // bs
            if hi > stop:
                hi = stop
            if hi <= lo:
                continue
            if first_needed_block is not None:
                first = first_needed_block(p)
                if first > lo:
                    if first > hi:
                        first = hi
                    out.append((lo, first, BEYOND))
                    lo = first
            if hi > lo:
                out.append((lo, hi, p))
            lo = hi
        if stop > lo:
            out.append((lo, stop, BEYOND))
        return out


def release_order(entries: list[Any]) -> list[Any]:
    """``(unit point, end position, group, block, ...)`` entries in release order.

    Largest unit first, within a unit the deepest position first (then the
    lowest group): the free queue then evicts a whole hit unit, deepest first,
    before the next. Sorts ``entries`` in place and returns it.
    """
    # Two stable sorts with C keys (``reverse`` keeps equal keys in order); the
    # first is a linear pass when entries come group by group.
    entries.sort(key=itemgetter(2))
    entries.sort(key=itemgetter(0, 1), reverse=True)
    return entries


def tail_tokens_saved(end: int, point: int, step: int) -> int:
    """Tokens a tail point saves over the next coarser one below it.

    Tail point ``end - k * step`` has level ``v``, the number of trailing zero
    bits of ``k``; dropping it moves a hit there down to the nearest point of a
    higher level, ``step * 2**v`` tokens lower. Evicting the lowest levels
    first thins the tail evenly (every other point, then every fourth...).
    """
    k = (end - point) // step
    return step * (k & -k)


class UnitValues:
    """What a freed request's hit units save per page held (cost-aware eviction).

    *Main points* are the request's kept points, the aligned end (``top``)
    and ``E``. The unit of main point ``m`` holds the full-attention blocks
    after the previous main point and the non-full blocks ``m`` is the
    smallest point to need; its value is ``(m - previous main point) /
    pages``. Values are capped by every shallower unit's (``chain``): a deeper
    unit needs the shallower full blocks, so it must never outlive them. A
    tail point's own blocks (``shared`` False: a Mamba state, or in an aligned
    tail a window or chunk the aligned end does not need) are worth
    ``saved_by`` over the point's pages, capped by the aligned end's chain
    value. Anything else in the tail is
    valued as the aligned end's unit: sliding windows and chunks of tail
    points nest (a lower point needs more of them), so what a lower point
    shares with the aligned end goes with it.

    Full-attention blocks on the way to a free point (``FinalPoints.is_free``)
    are worth at least that point's own ratio (``full_value``): its hit needs
    nothing else, so the cap that a shallower point's window, chunk or state
    puts on deeper units does not bind them. Such a point has no block of its
    own to lose, so the lift stays true while the blocks are free; a point
    with blocks of its own lifts nothing (they go first, and the lift would
    outlive them). The shallower point's own blocks keep its chain value.
    """

    __slots__ = ("chain", "extra_pages", "full_value", "main", "points")

    def __init__(
        self,
        points: FinalPoints,
        full_units: Mapping[int, int],
        extra_pages: Mapping[int, int],
        owner_pages: Mapping[int, int] | None = None,
    ) -> None:
        """``full_units`` / ``extra_pages``: full-attention / other pages by unit
        point (``FinalPoints``); ``owner_pages``: more other pages by main point,
        in its ratio (``release.charged_pages``; None: none)."""
        main = self.main_points(points)
        self.main = main
        self.points = points
        self.extra_pages = extra_pages
        full_pages: dict[int, int] = {}
        n_main = len(main)
        for unit, n in full_units.items():
            i = bisect_left(main, unit)  # the unit's owner (``main_owner``)
            if i < n_main:
                owner = main[i]
                full_pages[owner] = full_pages.get(owner, 0) + n
        owned = owner_pages or {}
        chain: dict[int, float] = {}
        ratio: dict[int, float] = {}
        prev, best = 0, float("inf")
        for m in main:
            pages = full_pages.get(m, 0) + extra_pages.get(m, 0) + owned.get(m, 0)
            r = ratio[m] = (m - prev) / (pages if pages > 1 else 1)
            if r < best:
                best = r
            chain[m] = best
            prev = m
        self.chain = chain
        #: Value of the full-attention blocks of each main point's unit: its
        #: chain value, lifted by the free points at or past it (non-increasing).
        self.full_value = chain
        if points.free_period:
            lifted: dict[int, float] = {}
            lift = 0.0
            for m in reversed(main):
                if points.is_free(m):
                    lift = max(lift, ratio[m])
                lifted[m] = max(chain[m], lift)
            self.full_value = lifted

    @staticmethod
    def main_points(points: FinalPoints) -> list[int]:
        """The main points, ascending: the kept points, the aligned end and ``E``."""
        return sorted({p for p in (*points.kept, points.top, points.end) if p})

    def main_owner(self, block_end: int) -> int | None:
        """The smallest main point at or after ``block_end`` (None: past ``E``)."""
        i = bisect_left(self.main, block_end)
        return self.main[i] if i < len(self.main) else None

    def of_full(self, block_end: int) -> float | None:
        """Value of a full-attention block ending at ``block_end`` (None: past ``E``)."""
        m = self.main_owner(block_end)
        return None if m is None else self.full_value[m]

    def of_other(self, point: int, shared: bool) -> float:
        """Value of a non-full block whose smallest covering point is ``point``;
        ``shared``: not a tail point's own block (see the class docstring)."""
        v = self.chain.get(point)
        if v is not None:
            return v
        top = self.chain[self.points.top]
        if shared:
            return top
        saved = self.points.saved_by(point)
        return min(top, saved / max(1, self.extra_pages.get(point, 0)))
