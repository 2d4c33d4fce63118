"""How a finished request's blocks return to the free set under ``hybrid``.

``release_hybrid`` sorts every block of the request's tables into:

- *shared*: others still hold it (ref count > 1); its count drops, no order;
- *dead*: cached, but no kept hit point needs it; released evict-first;
- *entries*: the rest, each in the hit unit of the smallest kept point that
  needs it (``FinalPoints``), released unit by unit: the largest unit first,
  within a unit the deepest position first, then the lowest group. Under a
  policy that ranks by value, each run of one unit and kind is released with
  what the unit saves per page (``UnitValues``).

The unit of a block is the smallest point at or past its end, so a deeper
block never has a smaller unit: "largest unit, then deepest" is the end
position, descending, then the group (entries no point covers, *beyond*,
first). A freed request is thousands of blocks, so the only per-block work
is reading ref counts and hashes (list comprehensions, which read slots about
twice as fast as ``map(attrgetter)`` on CPython 3.11): each group's table is
cut into *pieces*, index ranges of one unit and kind held by this request
alone (a few per kept point), and the groups' pieces are interleaved by end
position with C-level slices (``hybridkv.policy.interleave``). The result is
exactly the block-by-block rule above (``tests/test_hybrid_release.py`` checks
it against that form)::

    group 0 (full)    ........[ P1 ][   E   ]      pieces: index ranges
    group 1 (window)  ..........[P1][   E   ]      of one unit and kind
    release order:    E's blocks from the end, group 0 then 1 at each
                      index (one zip of reversed slices), then P1's
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat

from hybridkv.core.block import KVCacheBlock
from hybridkv.managers.base import RequestBlockState, SingleTypeKVCacheManager
from hybridkv.policy.base import ReleaseRun
from hybridkv.policy.interleave import Lane, Span, interleave
from hybridkv.policy.retention import BEYOND, FinalPoints, UnitValues

#: ``bytes.translate`` table: byte 1 stays 1, every other byte becomes 0.
_ONE_ONLY = bytes(i == 1 for i in range(256))

#: Table indices ``[lo, hi)`` of one unit and kind (0: full attention, 1: a
#: block other points may need, 2: a tail point's own state).
Piece = tuple[int, int, int, int]


def release_hybrid(
    managers: Sequence[SingleTypeKVCacheManager],
    states: Sequence[RequestBlockState],
    points: FinalPoints,
    point_local: Sequence[bool],
    factor: float = 1.0,
    ranks_by_value: bool = True,
    charge_shared: bool = False,
) -> list[ReleaseRun]:
    """One request's tables as runs to release, in order (module docstring). ``point_local[g]``:
    group ``g``'s hit point needs a block of its own (a Mamba state), so its
    blocks below ``E``'s needed range are kind 2 (a tail point's own state).
    In an aligned tail, so are a window's or chunk's blocks below the aligned
    end's needed range (only lower tail points need them). ``factor``
    multiplies every unit's value (a returning request's, ``returning``).
    ``ranks_by_value``: the free set ranks by value (else no values are computed).
    ``charge_shared``: a unit's ratio counts the window or chunk blocks its tail
    points share with it (``UnitValues``'s ``shared_pages``)."""
    shared: list[KVCacheBlock] = []
    dead: list[KVCacheBlock] = []
    #: Per group: its blocks by table index, block size, pieces of a point,
    #: pieces beyond every point (hashless blocks: kind 1, no value).
    groups: list[tuple[list[KVCacheBlock], int, list[Piece], list[Piece]]] = []
    end, top, align = points.end, points.top, points.align
    any_beyond = False
    last_own = 0
    #: The last cut group's spec, local flag and table range, its spans and
    #: ``own_below``: the next group of an equal spec (one geometry) shares them.
    last_key: tuple[object, ...] = ()
    spans: list[tuple[int, int, int]] = []
    for m, st, local in zip(managers, states, point_local, strict=True):
        bs = m.block_size
        blocks = st.blocks
        within: list[Piece] = []
        beyond: list[Piece] = []
        # (a full group's kinds do not depend on ``own_below``)
        first = m.first_needed_block if m.has_skips else None
        own_below = 0
        start, stop = st.num_skipped, len(blocks)
        if stop > start:
            held = _held_runs(blocks, start, stop, shared)
            if held:
                key = (m.spec, local, start, stop)
                if key == last_key:
                    own_below = last_own
                else:
                    if first is not None and (local or align):
                        own_below = first(end if local else top)
                    spans = points.spans(first, bs, start, stop)
                    last_key, last_own = key, own_below
                _cut(blocks, spans, held, first is None, own_below, within, beyond, dead)
        if st.retained:  # skipped blocks a kept point holds: few, below the table
            if first is not None and (local or align):
                own_below = first(end if local else top)
            blocks = _with_retained(
                st,
                points.unit_of(first, bs),
                first is None,
                own_below,
                within,
                beyond,
                shared,
                dead,
            )
        any_beyond = any_beyond or bool(beyond)
        groups.append((blocks, bs, within, beyond))
    runs = [ReleaseRun(shared), ReleaseRun(dead, True, held=True)]
    # Hashless blocks beyond every point go first, with no value.
    chunks = interleave(_unvalued(groups, True)) if any_beyond else []
    if not ranks_by_value:  # recency only: one release, in unit order
        chunks += interleave(_unvalued(groups, False))
        runs.append(ReleaseRun(list(chain.from_iterable(b for b, _ in chunks)), held=True))
        return runs
    firsts = [m.first_needed_block if m.has_skips else None for m in managers]
    chunks += interleave(_valued(points, groups, factor, firsts, charge_shared))
    run: list[KVCacheBlock] = []
    run_value: float | None = None
    for blocks, v in chunks:
        if v != run_value and run:
            runs.append(ReleaseRun(run, False, run_value, True))
            run = []
        run_value = v
        run += blocks
    if run:
        runs.append(ReleaseRun(run, False, run_value, True))
    return runs


def _unvalued(
    groups: list[tuple[list[KVCacheBlock], int, list[Piece], list[Piece]]], beyond: bool
) -> list[Lane]:
    """Each group's pieces of a point (``beyond``: beyond every point) as
    spans with no value."""
    lanes: list[Lane] = []
    for blocks, bs, within, out in groups:
        pieces = out if beyond else within
        if pieces:
            lanes.append((blocks, bs, [(lo, hi, None) for lo, hi, _, _ in pieces]))
    return lanes


def _with_retained(
    st: RequestBlockState,
    unit_of: Callable[[int], int],
    full: bool,
    own_below: int,
    within: list[Piece],
    beyond: list[Piece],
    shared: list[KVCacheBlock],
    dead: list[KVCacheBlock],
) -> list[KVCacheBlock]:
    """Place the blocks ``st`` retains (skipped blocks a kept point holds, in
    any order, all below the table's held entries): shared, dead (in their
    order) or pieces, put in front of ``within`` / ``beyond``. Returns the
    table with each retained block at its index."""
    blocks = list(st.blocks)
    own: list[Piece] = []
    for i, b in st.retained:
        if b.is_null:
            continue
        if b.ref_cnt > 1:  # others hold it: it stays in use, in no order
            shared.append(b)
            continue
        unit = unit_of(i)
        if unit == BEYOND and b.block_hash is not None:
            dead.append(b)  # no kept point's hit needs it
            continue
        kind = 1 if unit == BEYOND else 0 if full else 2 if i < own_below else 1
        own.append((i, i + 1, unit, kind))
        blocks[i] = b
    ret_within: list[Piece] = []
    ret_beyond: list[Piece] = []
    for lo, hi, unit, kind in sorted(own):
        _add(ret_beyond if unit == BEYOND else ret_within, lo, hi, unit, kind)
    within[:0] = ret_within
    beyond[:0] = ret_beyond
    return blocks


def _add(pieces: list[Piece], lo: int, hi: int, unit: int, kind: int) -> None:
    """Append ``[lo, hi)`` of ``(unit, kind)``, joined to the last piece where
    it continues it."""
    if pieces:
        a, z, u, k = pieces[-1]
        if z == lo and u == unit and k == kind:
            pieces[-1] = (a, hi, unit, kind)
            return
    pieces.append((lo, hi, unit, kind))


def _counts(refs: list[int]) -> bytes:
    """``refs`` as bytes, each count above 2 as 2 when one does not fit a byte:
    0 (the null block), 1 (held by this request alone) or more (shared), so
    that ``count``, ``find`` and ``in`` run in C."""
    try:
        return bytes(refs)
    except ValueError:  # a count of 256 or more
        return bytes(map(min, refs, repeat(2)))


def _held_runs(
    blocks: list[KVCacheBlock], start: int, stop: int, shared: list[KVCacheBlock]
) -> list[tuple[int, int]]:
    """The ascending index ranges of ``blocks[start:stop]`` that only this
    request holds (ref count 1); the others, not null, go to ``shared``
    (a ref count of 0 in a table is the null block's)."""
    seg = blocks[start:stop]
    # (a comprehension reads slots faster than ``map``)
    counts = _counts([b.ref_cnt for b in seg])
    n = len(counts)
    ones = counts.count(1)
    if ones == n:  # the usual tail of a table
        return [(start, stop)]
    if not ones:
        shared += [b for b in seg if not b.is_null] if 0 in counts else seg
        return []
    k = counts.find(1)
    if ones == n - k:  # others, then only ones
        shared += [b for b in seg[:k] if not b.is_null] if counts.find(0, 0, k) >= 0 else seg[:k]
        return [(start + k, stop)]
    return _walk_runs(seg, counts, start, shared)


def _walk_runs(
    seg: list[KVCacheBlock], counts: bytes, start: int, shared: list[KVCacheBlock]
) -> list[tuple[int, int]]:
    """``_held_runs`` of ``seg`` (table entries from ``start``; ``counts``: their
    ref counts, ``_counts``) by a walk over its runs of ones and others."""
    mask = counts.translate(_ONE_ONLY)
    n = len(counts)
    runs = []
    i = 0
    while i < n:
        j = mask.find(1, i)
        if j < 0:
            j = n
        if j > i:
            shared += [b for b in seg[i:j] if not b.is_null]
        if j == n:
            break
        k = mask.find(0, j)
        if k < 0:
            k = n
        runs.append((start + j, start + k))
        i = k
    return runs


def _cut(
    blocks: list[KVCacheBlock],
    spans: list[tuple[int, int, int]],
    held: list[tuple[int, int]],
    full: bool,
    own_below: int,
    within: list[Piece],
    beyond: list[Piece],
    dead: list[KVCacheBlock],
) -> None:
    """The held ranges cut by the points' spans (``FinalPoints.spans``) into
    pieces (``within``, ascending), or, beyond every point, into ``dead``
    (cached: evict-first) and ``beyond`` (hashless)."""
    k = 0
    nspans = len(spans)
    add = within.append  # spans of one held range have distinct units: nothing to join
    for a, z in held:
        while k < nspans and spans[k][1] <= a:
            k += 1
        j = k
        while j < nspans:
            lo, hi, unit = spans[j]
            if lo >= z:
                break
            if lo < a:
                lo = a
            if hi > z:
                hi = z
            if unit == BEYOND:
                seg = blocks[lo:hi]
                if None not in [b.block_hash for b in seg]:
                    dead += seg  # no kept point's hit needs them
                else:
                    for i, b in enumerate(seg, lo):
                        if b.block_hash is not None:
                            dead.append(b)
                        else:
                            _add(beyond, i, i + 1, unit, 1)
            elif full:
                add((lo, hi, unit, 0))
            elif own_below <= lo:
                add((lo, hi, unit, 1))
            elif own_below >= hi:
                add((lo, hi, unit, 2))
            else:  # kind 2 below ``own_below``, 1 from it
                add((lo, own_below, unit, 2))
                add((own_below, hi, unit, 1))
            j += 1


def charged_pages(
    main: Sequence[int], pieces: Iterable[tuple[int, int, int, Callable[[int], int]]]
) -> dict[int, int]:
    """Pages a main point's hit needs that its unit does not hold, by main point.

    ``pieces``: ``(lo, hi, unit, first_needed_block)`` table ranges of a
    window's or chunk's blocks (not a tail point's own state) in the unit of
    ``unit``. A range in the unit of a tail point below main point ``m`` (its
    *owner*, the smallest main point at or past it) whose needed range nests
    in ``m``'s (``first_needed_block`` equal at both: one chunk) is needed by
    ``m``'s hit as much as by the tail point's: those pages are ``m``'s too.
    A window's lower tail point reaches further back than ``m``: nothing is
    charged (charging the window blocks ``m`` needs lost up to 8 points on
    Gemma 3; ``benchmarks/results/policy-ablation.md``, "Tail pages").
    """
    out: dict[int, int] = {}
    main_set = set(main)
    n = len(main)
    for lo, hi, unit, first in pieces:
        if unit in main_set:
            continue
        i = bisect_left(main, unit)
        if i == n:
            continue
        owner = main[i]
        if first(unit) == first(owner):
            out[owner] = out.get(owner, 0) + hi - lo
    return out


def _valued(
    points: FinalPoints,
    groups: list[tuple[list[KVCacheBlock], int, list[Piece], list[Piece]]],
    factor: float,
    firsts: Sequence[Callable[[int], int] | None],
    charge_shared: bool,
) -> list[Lane]:
    """Each group's pieces of a point as spans with their unit's value
    (``UnitValues``, times ``factor``), adjacent spans of one value joined.
    ``firsts``: each group's ``first_needed_block`` (None: full attention);
    ``charge_shared``: with ``charged_pages``."""
    full_units: dict[int, int] = {}
    extra_pages: dict[int, int] = {}
    shared: list[tuple[int, int, int, Callable[[int], int]]] = []
    for g, first in zip(groups, firsts, strict=True):
        for lo, hi, unit, kind in g[2]:
            pages = extra_pages if kind else full_units
            pages[unit] = pages.get(unit, 0) + hi - lo
            if kind == 1 and charge_shared and first is not None:
                shared.append((lo, hi, unit, first))
    owner_pages = charged_pages(UnitValues.main_points(points), shared) if charge_shared else None
    values = UnitValues(points, full_units, extra_pages, owner_pages)
    known: dict[tuple[int, int], float] = {}
    lanes: list[Lane] = []
    for blocks, bs, pieces, _ in groups:
        if not pieces:
            continue
        spans: list[Span] = []
        last: Span | None = None
        for lo, hi, unit, kind in pieces:
            v = known.get((unit, kind))
            if v is None:
                v = values.of_full(unit) if kind == 0 else values.of_other(unit, kind == 1)
                assert v is not None, "a unit within the points has a value"
                if factor != 1.0:
                    v *= factor
                known[unit, kind] = v
            if last is not None and last[1] == lo and last[2] == v:
                spans[-1] = last = (last[0], hi, v)
            else:
                spans.append(last := (lo, hi, v))
        lanes.append((blocks, bs, spans))
    return lanes
