"""How a finished request's blocks return to the free set under ``hybrid``.

``release_hybrid`` sorts every block of the request's tables into:

- *shared*: others still hold it (ref count > 1); its count drops, no order;
- *dead*: cached, but no kept hit point needs it; released evict-first;
- *entries*: the rest, each in the hit unit of the smallest kept point that
  needs it (``FinalPoints``), released unit by unit: the largest unit first,
  within a unit the deepest position first, then the lowest group. Under a
  policy that ranks by value, each run of one unit and kind is released with
  what the unit saves per page (``UnitValues``).

This is the hot path of a freed request (thousands of blocks), so the
placement is per span, not per block: a span of blocks only this request
holds is placed with C-level ``zip`` / ``extend``, and each entry carries one
integer sort key (unit rank, then end position) so the release order is a
single sort. The result is exactly the block-by-block rule above
(``tests/test_hybrid_release.py`` checks it against that form).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain, filterfalse, groupby, repeat
from operator import attrgetter, itemgetter

from hybridkv.core.block import KVCacheBlock
from hybridkv.managers.base import RequestBlockState, SingleTypeKVCacheManager
from hybridkv.policy.base import ReleaseRun
from hybridkv.policy.retention import BEYOND, FinalPoints, UnitValues

#: Bits of an entry's sort key below its unit's rank: the end position.
_POS_BITS = 40

_ref_cnt = attrgetter("ref_cnt")
_hash = attrgetter("block_hash")
_is_null = attrgetter("is_null")
_is_one = (1).__eq__
#: ``bytes.translate`` table: byte 1 stays 1, every other byte becomes 0.
_ONE_ONLY = bytes(i == 1 for i in range(256))
_key = itemgetter(0)
_block = itemgetter(2)
_unit_kind = itemgetter(3)


def release_hybrid(
    managers: Sequence[SingleTypeKVCacheManager],
    states: Sequence[RequestBlockState],
    points: FinalPoints,
    point_local: Sequence[bool],
    factor: float = 1.0,
    ranks_by_value: bool = True,
) -> list[ReleaseRun]:
    """One request's tables as runs to release, in order (module docstring). ``point_local[g]``:
    group ``g``'s hit point needs a block of its own (a Mamba state), so its
    blocks below ``E``'s needed range are kind 2 (a tail point's own state).
    In an aligned tail, so are a window's or chunk's blocks below the aligned
    end's needed range (only lower tail points need them). ``factor``
    multiplies every unit's value (a returning request's, ``returning``).
    ``ranks_by_value``: the free set ranks by value (else no values are computed)."""
    end, top = points.end, points.top
    place = _Placer(points.points)
    for gid, (m, st) in enumerate(zip(managers, states, strict=True)):
        bs = m.block_size
        full = not m.has_skips
        first = None if full else m.first_needed_block
        if point_local[gid]:
            own_below = m.first_needed_block(end)
        else:
            own_below = m.first_needed_block(top) if points.align else 0  # full: unused
        place.group(gid, bs, full, own_below)
        place.spans(st.blocks, points.spans(first, bs, st.num_skipped, len(st.blocks)))
        if st.retained:  # skipped blocks a kept point holds: few
            unit_of = points.unit_of(first, bs)
            units = [unit_of(i) for i, _ in st.retained]
            for unit, same in groupby(zip(units, st.retained, strict=True), itemgetter(0)):
                place(map(itemgetter(1), same), unit)
    runs = [ReleaseRun(place.shared), ReleaseRun(place.dead, True)]
    entries = place.entries
    # Entries came group by group, so a stable sort on the key alone (reverse
    # keeps equal keys in order) leaves equal positions in group order.
    entries.sort(key=_key, reverse=True)
    if not ranks_by_value:  # recency only: one release, in unit order
        runs.append(ReleaseRun(list(map(_block, entries))))
        return runs
    full_units: dict[int, int] = {}
    extra_pages: dict[int, int] = {}
    for (unit, kind), n in zip(place.unit_kinds, place.counts, strict=True):
        if unit != BEYOND:
            pages = extra_pages if kind else full_units
            pages[unit] = pages.get(unit, 0) + n
    values = UnitValues(points, full_units, extra_pages)
    value_of = [
        None
        if unit == BEYOND
        else values.of_full(unit)
        if kind == 0
        else values.of_other(unit, kind == 1)
        for unit, kind in place.unit_kinds
    ]
    if factor != 1.0:
        value_of = [None if v is None else v * factor for v in value_of]
    # Consecutive entries of one (unit, kind) share a value; adjacent runs of
    # equal value are released together.
    run: list[KVCacheBlock] = []
    run_value: float | None = None
    for uk, group in groupby(entries, _unit_kind):
        v = value_of[uk]
        if v != run_value and run:
            runs.append(ReleaseRun(run, False, run_value))
            run = []
        run_value = v
        run.extend(map(_block, group))
    if run:
        runs.append(ReleaseRun(run, False, run_value))
    return runs


def _ones(refs: list[int]) -> bytes:
    """``refs`` as bytes: 1 where a ref count is 1, else 0 (in C when every
    count fits a byte)."""
    try:
        return bytes(refs).translate(_ONE_ONLY)
    except ValueError:  # a count of 256 or more
        return bytes(map(_is_one, refs))


class _Placer:
    """Sorts a freed request's blocks, group by group (``release_hybrid``).

    ``entries`` holds ``(key, group, block, unit kind id)``: ``key`` is the
    unit's rank among the points (``BEYOND`` last) shifted above the block's
    end position; the id indexes ``unit_kinds`` ``(unit, kind)``, whose
    entries ``counts`` counts. Kind 0 is full attention, 1 a block other
    points may need (or no point), 2 a tail point's own state (a block before
    ``own_below``).
    """

    __slots__ = (
        "bs",
        "counts",
        "dead",
        "entries",
        "full",
        "gid",
        "own_below",
        "rank",
        "shared",
        "unit_kind_id",
        "unit_kinds",
    )

    def __init__(self, points: Sequence[int]) -> None:
        self.rank = {p: r for r, p in enumerate(points)}
        self.rank[BEYOND] = len(points)
        self.shared: list[KVCacheBlock] = []
        self.dead: list[KVCacheBlock] = []
        self.entries: list[tuple[int, int, KVCacheBlock, int]] = []
        self.unit_kinds: list[tuple[int, int]] = []
        self.unit_kind_id: dict[tuple[int, int], int] = {}
        self.counts: list[int] = []
        self.group(0, 1, True, 0)

    def group(self, gid: int, bs: int, full: bool, own_below: int) -> None:
        """Place the next group's blocks (groups in ascending order)."""
        self.gid, self.bs, self.full, self.own_below = gid, bs, full, own_below

    def _id(self, unit: int, kind: int) -> int:
        uk = (unit, kind)
        i = self.unit_kind_id.get(uk)
        if i is None:
            i = self.unit_kind_id[uk] = len(self.unit_kinds)
            self.unit_kinds.append(uk)
            self.counts.append(0)
        return i

    def spans(self, blocks: list[KVCacheBlock], spans: list[tuple[int, int, int]]) -> None:
        """Place the group's table entries by ascending ``(lo, hi, unit)`` spans.

        Spans of a point whose blocks only this request holds are placed in
        one ``extend`` for the whole group (a tail has a point per block, so
        most spans are one block long); the others go through ``span``.
        Within a group the entries' order does not matter (their keys differ).
        The usual table is blocks others hold too (a shared prefix; null
        blocks) and then blocks only this request holds: the first part goes
        to ``shared`` in one pass, and only the spans of the second are placed.
        """
        if not spans:
            return
        start = spans[0][0]
        seg = blocks[start : spans[-1][1]]
        refs = list(map(_ref_cnt, seg))
        ones = None if refs.count(1) == len(refs) else _ones(refs)
        held = start  # table entries from here on: ref count 1, or ``ones`` says
        if ones is not None:
            k = ones.find(1)
            if k < 0:
                k = len(refs)
            if ones.find(0, k) < 0:  # ref counts != 1, then only 1s
                # A ref count of 0 in a table is the null block's.
                self.shared += filterfalse(_is_null, seg[:k]) if 0 in refs else seg[:k]
                held += k
                ones = None
        bs, full, own_below = self.bs, self.full, self.own_below
        keys: list[range] = []
        segs: list[list[KVCacheBlock]] = []
        uks: list[repeat[int]] = []
        ids, counts = self.unit_kind_id, self.counts
        for lo, hi, unit in spans:
            if hi <= held:
                continue
            lo = max(lo, held)
            if ones is not None and ones.find(0, lo - start, hi - start) >= 0:
                self.span(blocks, lo, hi, unit)
                continue
            if unit == BEYOND:  # every block held by this request alone
                self._held(blocks[lo:hi], lo, unit)
                continue
            base = self.rank[unit] << _POS_BITS
            cut = lo if full else min(max(own_below, lo), hi)  # kind 2 below, 1 from
            for a, z, kind in ((lo, cut, 2), (cut, hi, 0 if full else 1)):
                if z > a:
                    uk = ids.get((unit, kind))
                    if uk is None:
                        uk = self._id(unit, kind)
                    counts[uk] += z - a
                    keys.append(range(base + (a + 1) * bs, base + (z + 1) * bs, bs))
                    segs.append(blocks[a:z])
                    uks.append(repeat(uk, z - a))
        if keys:
            self.entries.extend(
                zip(
                    chain.from_iterable(keys),
                    repeat(self.gid),
                    chain.from_iterable(segs),
                    chain.from_iterable(uks),
                )
            )

    def span(self, blocks: list[KVCacheBlock], lo: int, hi: int, unit: int) -> None:
        """Place table entries ``[lo, hi)``, whose unit point is ``unit``:
        runs that only this request holds (ref count 1: none null, none
        shared) in bulk, and the runs between them (null blocks, skipped;
        blocks others hold too, shared) in bulk as well."""
        seg = blocks[lo:hi]
        refs = list(map(_ref_cnt, seg))
        if refs.count(1) == len(seg):
            self._held(seg, lo, unit)
            return
        ones = _ones(refs)
        i, n = 0, len(seg)
        while i < n:
            j = ones.find(0, i)
            if j < 0:
                j = n
            if j > i:
                self._held(seg[i:j], lo + i, unit)
            if j == n:
                return
            k = ones.find(1, j)
            if k < 0:
                k = n
            # Null (ref count 0) or held by others too: shared, whatever the unit.
            self.shared += filterfalse(_is_null, seg[j:k])
            i = k

    def _held(self, seg: list[KVCacheBlock], lo: int, unit: int) -> None:
        """Place ``seg`` (table entries from ``lo``), every block held by this
        request alone, in bulk."""
        hi = lo + len(seg)
        pieces: tuple[tuple[int, int, int], ...]
        if unit == BEYOND:
            if None not in map(_hash, seg):
                self.dead += seg  # no kept point's hit needs them
                return
            hashless = list(map(_hash, seg)).count(None)
            if hashless != len(seg):
                self(zip(range(lo, hi), seg, strict=True), unit)
                return
            pieces = ((lo, hi, 1),)
        else:
            cut = lo if self.full else min(max(self.own_below, lo), hi)
            pieces = ((lo, cut, 2), (cut, hi, 0 if self.full else 1))
        bs, gid = self.bs, self.gid
        base = self.rank[unit] << _POS_BITS
        for a, z, kind in pieces:
            if z > a:
                uk = self._id(unit, kind)
                self.counts[uk] += z - a
                self.entries.extend(
                    zip(
                        range(base + (a + 1) * bs, base + (z + 1) * bs, bs),
                        repeat(gid),
                        seg[a - lo : z - lo],
                        repeat(uk),
                    )
                )

    def __call__(self, pairs: Iterable[tuple[int, KVCacheBlock]], unit: int) -> None:
        """Place ``(index, block)`` pairs whose unit point is ``unit``, one by one."""
        beyond = unit == BEYOND
        gid, bs, full, own_below = self.gid, self.bs, self.full, self.own_below
        base = self.rank[unit] << _POS_BITS
        for i, b in pairs:
            if b.is_null:
                continue
            if b.ref_cnt > 1:  # others hold it: it stays in use, in no order
                self.shared.append(b)
            elif beyond and b.block_hash is not None:
                self.dead.append(b)  # no kept point's hit needs it
            else:
                kind = 1 if beyond else 0 if full else 2 if i < own_below else 1
                uk = self._id(unit, kind)
                self.counts[uk] += 1
                self.entries.append((base + (i + 1) * bs, gid, b, uk))
