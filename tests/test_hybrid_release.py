"""``release_hybrid`` equals its block-by-block definition.

The production release places blocks span by span in C and sorts entries on
one integer key (``hybridkv.policy.release``). The reference here
is the rule itself, one block at a time: each block's unit from
``FinalPoints.unit_of``, release order from ``release_order``, pages per
unit counted one by one. Every ``free`` of a random hybrid workload (shared
prefixes, kept points, tail points, preemptions, sliding / chunked / Mamba
groups) must make the very same ``free_blocks`` calls, in the same order.
"""

from __future__ import annotations

import random
from itertools import groupby
from operator import itemgetter
from typing import Any

import pytest
from factories import chunked, full, mamba, manager, req, swa

from hybridkv import KVCacheManager
from hybridkv.core.block import KVCacheBlock
from hybridkv.policy import interleave, release
from hybridkv.policy.release import release_hybrid
from hybridkv.policy.retention import BEYOND, FinalPoints, UnitValues, release_order

LAYOUTS = {
    "sliding": (full(4), swa(4, 7), swa(4, 7)),
    "chunked": (full(4), chunked(4, 8)),
    "mamba": (full(4), mamba(4), mamba(4)),
    "two-sizes": (full(2), swa(6, 10), mamba(6)),
}

Call = tuple[tuple[int, ...], bool, float | None]


def reference(
    coord: Any,
    states: list[Any],
    points: FinalPoints,
    record: list[Call],
    factor: float = 1.0,
    charge: bool = True,
) -> None:
    """The release rule block by block (what ``release_hybrid`` must equal);
    ``factor``: a returning request's, on every unit's value; ``charge``
    (``charge_tail_pages``): a tail point's window or chunk block (kind 1)
    whose needed range starts where its main owner's does is that owner's
    page too."""
    shared: list[KVCacheBlock] = []
    dead: list[KVCacheBlock] = []
    entries: list[tuple[int, int, int, KVCacheBlock, int]] = []
    for gid, (m, st) in enumerate(zip(coord.managers, states, strict=True)):
        bs = m.block_size
        full_group = not m.has_skips
        unit_of = points.unit_of(None if full_group else m.first_needed_block, bs)
        own_below = m.first_needed_block(points.end) if coord.policy.point_local[gid] else 0
        pairs = [(i, st.blocks[i]) for i in range(st.num_skipped, len(st.blocks))]
        for i, b in [*pairs, *st.retained]:
            unit = unit_of(i)
            beyond = unit == BEYOND
            if b.is_null:
                continue
            if b.ref_cnt > 1:
                shared.append(b)
            elif beyond and b.block_hash is not None:
                dead.append(b)
            else:
                kind = 1 if beyond else 0 if full_group else 2 if i < own_below else 1
                entries.append((unit, (i + 1) * bs, gid, b, kind))
    record.append((tuple(b.block_id for b in shared), False, None))
    record.append((tuple(b.block_id for b in dead), True, None))
    full_units: dict[int, int] = {}
    extra_pages: dict[int, int] = {}
    owner_pages: dict[int, int] = {}
    main = sorted({p for p in (*points.kept, points.top, points.end) if p})
    for unit, _, gid, _, kind in entries:
        if unit != BEYOND:
            pages = extra_pages if kind else full_units
            pages[unit] = pages.get(unit, 0) + 1
            owner = next((p for p in main if p >= unit), None)
            first = coord.managers[gid].first_needed_block
            if charge and kind == 1 and owner not in (None, unit) and first(unit) == first(owner):
                owner_pages[owner] = owner_pages.get(owner, 0) + 1  # type: ignore[index]
    values = UnitValues(points, full_units, extra_pages, owner_pages if charge else None)
    run: list[KVCacheBlock] = []
    run_value: float | None = None
    for (unit, kind), group in groupby(release_order(entries), itemgetter(0, 4)):
        if unit == BEYOND:
            v = None
        elif kind == 0:
            v = values.of_full(unit)
        else:
            v = values.of_other(unit, kind == 1)
        if v is not None:
            v *= factor
        if v != run_value and run:
            record.append((tuple(b.block_id for b in run), False, run_value))
            run = []
        run_value = v
        run.extend(e[3] for e in group)
    if run:
        record.append((tuple(b.block_id for b in run), False, run_value))


def checked(kv: KVCacheManager, counter: list[int]) -> None:
    """Wrap ``kv``'s hybrid release: compare with the reference, then release."""
    policy: Any = kv.policy
    real = policy.release

    def release(request_id: str, tables: Any, block_hashes: Any, num_tokens: Any) -> Any:
        managers = [m for m, _ in tables]
        states = [st for _, st in tables]
        factor = policy.return_value(policy._returning.get(request_id, 0))
        lcm = policy.step
        end = min(st.num_cached * m.block_size for m, st in tables)
        end -= end % lcm
        points = FinalPoints(
            states[0].kept,
            end,
            policy.tail,
            lcm,
            policy.tail_alignment.align,
            num_tokens=num_tokens,
        )
        runs = release_hybrid(managers, states, points, policy.point_local, factor)
        mine = [(tuple(b.block_id for b in r.blocks), r.evict_first, r.value) for r in runs]
        ref: list[Call] = []
        reference(kv.coordinator, states, points, ref, factor, charge=False)
        assert [c for c in mine if c[0]] == [c for c in ref if c[0]]
        # ``charge_tail_pages`` on: the ratios with the chunk pages charged.
        args = (managers, states, points, policy.point_local, factor, True, True)
        charged = [
            (tuple(b.block_id for b in r.blocks), r.evict_first, r.value)
            for r in release_hybrid(*args)
        ]
        ref_on: list[Call] = []
        reference(kv.coordinator, states, points, ref_on, factor, charge=True)
        assert [c for c in charged if c[0]] == [c for c in ref_on if c[0]]
        # A free set that ranks by recency alone: the same blocks in the same
        # order, every entry in one run (no values).
        plain = release_hybrid(managers, states, points, policy.point_local, factor, False)
        ids = [tuple(b.block_id for b in r.blocks) for r in plain]
        assert ids[:2] == [ref[0][0], ref[1][0]]
        assert ids[2:] == [tuple(i for c in ref[2:] for i in c[0])]
        assert all(r.value is None for r in plain)
        counter[0] += 1
        counter[1] += sum(len(c[0]) for c in mine)
        counter[2] += factor != 1.0
        return real(request_id, tables, block_hashes, num_tokens)

    policy.release = release


def _walked(blocks: list[Any], start: int, stop: int, shared: list[Any]) -> Any:
    """``_held_runs`` by its general walk for every table (the path taken when
    shared or null blocks lie between held ones), to check that path everywhere."""
    seg = blocks[start:stop]
    return release._walk_runs(seg, release._counts([b.ref_cnt for b in seg]), start, shared)


def _sorted(lanes: Any) -> Any:
    """``interleave`` by its sort (the path of different block sizes) always."""
    live = [lane for lane in lanes if lane[2]]
    return interleave.merge_sorted(live) if live else []


PATHS = {
    "bulk": {},
    "walked": {"_held_runs": _walked},
    "sorted": {"interleave": _sorted},
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("tail", [0, 24])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_release_matches_the_block_by_block_rule(
    layout: str, tail: int, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, fn in PATHS[path].items():
        monkeypatch.setattr(release, name, fn)
    kv = manager(
        64, *LAYOUTS[layout], max_model_len=120, cache_policy="hybrid", hybrid_tail_tokens=tail
    )
    counter = [0, 0, 0]
    checked(kv, counter)
    rng = random.Random(f"{layout}/{tail}")
    prefixes = [[rng.randrange(1000) for _ in range(60)] for _ in range(3)]
    live: dict[str, Any] = {}
    for step in range(700):
        if rng.random() < 0.3 or not live:
            rid = f"r{step}"
            r = req(rid, [*rng.choice(prefixes)[: rng.randrange(1, 60)], rng.randrange(1000)])
            hit, n = kv.get_computed_blocks(r)
            m = max(1, min(rng.randrange(1, 40), r.num_tokens - n))
            if kv.allocate_slots(r, m, n, hit) is None:
                kv.free(r)
                continue
            r.num_computed_tokens = n + m
            live[rid] = r
            continue
        rid = rng.choice(sorted(live))
        r = live[rid]
        if r.num_computed_tokens >= r.num_tokens:
            r.append_output_token_ids(2000 + step)
        n = min(r.num_tokens - r.num_computed_tokens, rng.choice([1, 1, 7]))
        done = rng.random() < 0.1 or r.num_computed_tokens + n > 110
        if not done and kv.allocate_slots(r, n) is not None:
            r.num_computed_tokens += n
            continue
        kv.free(r)  # finished, or preempted for want of blocks
        del live[rid]
        kv.check_integrity()
    assert counter[0] > 50 and counter[1] > 500, counter  # the comparison ran, on real tables
    assert counter[2] > 5, counter  # returning requests (value factor) among them


@pytest.mark.parametrize("big", [2, 255, 256, 70_000])
def test_held_runs_reads_counts_past_a_byte(big: int) -> None:
    """A block shared by 256 or more holders is shared like one of 2: the same
    runs and the same shared blocks (``_counts`` caps what does not fit a byte)."""
    null = KVCacheBlock(0)
    null.is_null = True
    blocks = [KVCacheBlock(i + 1) for i in range(9)]
    refs = [big, 1, 1, 0, big, 1, 2, 1, big]
    table = [null if r == 0 else b for b, r in zip(blocks, refs, strict=True)]
    for b, r in zip(table, refs, strict=True):
        b.ref_cnt = r
    shared: list[KVCacheBlock] = []
    assert release._held_runs(table, 0, 9, shared) == [(1, 3), (5, 6), (7, 8)]
    assert [b.block_id for b in shared] == [1, 5, 7, 9]
    shared = []
    assert release._held_runs(table, 4, 9, shared) == [(5, 6), (7, 8)]
    assert [b.block_id for b in shared] == [5, 7, 9]
    shared = []
    assert release._held_runs(table, 0, 3, shared) == [(1, 3)]
    assert [b.block_id for b in shared] == [1]
