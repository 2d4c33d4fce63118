"""A staged tier hit's parts (``Loads``' data): its loads, runs and unit keys.

``Loads`` (``loading.py``) restores a request's tier hit: the units it loads
are ``wanted`` as ``(group, block index, hash)``, each into a device block
held for it. Per unit, the work is a few C-level maps (``unit_keys``,
``block_ids``, ``load_of``'s fields), not Python loops: a 2k-token hit of
the demo's Gemma 3 is 288 units, and each microsecond per unit is 0.3 ms of
its load. A ``Load`` is one transfer's units of one group; its ``runs`` are
what the device prefix index takes at once (``BlockPool.cache_run``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple, TypeVar

from hybridkv.core.block import KVCacheBlock
from hybridkv.tiers import Transfer, UnitKey

T = TypeVar("T")
#: A unit to load: ``(group, block index in the group's table, block hash)``.
Wanted = tuple[int, int, bytes]


class Load(NamedTuple):
    """Units of one group copied into ``blocks`` from the ``medium`` tier by one
    transfer: a host-tier row batch (a group's units at once), else one unit."""

    group_id: int
    positions: list[int]  # each block's index in the group's table, ascending
    hashes: list[bytes]
    blocks: list[KVCacheBlock]
    transfer: Transfer | None  # None: the unit left its tier before the load began
    medium: str  # "CPU" (host), "DISK", "STORE"


@dataclass
class Staged:
    """A request's hit being restored: the blocks held for it and the loads."""

    held: list[KVCacheBlock]
    loads: list[Load]
    gained: int  # tokens past the device hit, if every load lands
    started: float  # when the loads were decided (before their units were pinned)


#: A run of consecutive blocks of one group: (group, first position, hashes, blocks).
Run = tuple[int, int, list[bytes], list[KVCacheBlock]]


def runs(ld: Load) -> Iterator[Run]:
    """``ld``'s units split into runs of consecutive blocks, in order."""
    pos, n = ld.positions, len(ld.positions)
    if pos[-1] - pos[0] == n - 1:  # (ascending and distinct: one run)
        yield ld.group_id, pos[0], ld.hashes, ld.blocks
        return
    start = 0
    for k in range(1, n + 1):
        if k == n or pos[k] != pos[k - 1] + 1:
            yield ld.group_id, pos[start], ld.hashes[start:k], ld.blocks[start:k]
            start = k


#: A wanted unit's fields, and a block's id (C-level getters).
_GROUP, _POSITION, _HASH = itemgetter(0), itemgetter(1), itemgetter(2)
_BLOCK_ID = attrgetter("block_id")


def unit_keys(wanted: Sequence[Wanted]) -> list[UnitKey]:
    """``UnitKey(h, g)`` of each wanted unit, built in C (``tuple.__new__`` over
    ``(hash, group)`` pairs: what ``UnitKey(h, g)`` makes, without its ``__new__``)."""
    pairs = zip(map(_HASH, wanted), map(_GROUP, wanted), strict=True)
    return list(map(tuple.__new__, repeat(UnitKey), pairs))


def block_ids(blocks: Sequence[KVCacheBlock]) -> list[int]:
    """Each block's id."""
    return list(map(_BLOCK_ID, blocks))


def pick(items: list[T], at: Sequence[int]) -> list[T]:
    """``items[j]`` for each ``j`` of ``at`` (a range: a slice)."""
    if isinstance(at, range) and at.step == 1:
        return items[at.start : at.stop]
    return [items[j] for j in at]


def load_of(
    wanted: list[Wanted],
    blocks: list[KVCacheBlock],
    units: Sequence[int],
    transfer: Transfer | None,
    medium: str,
) -> Load:
    """The load of ``wanted[j]`` into ``blocks[j]`` for each ``j`` of ``units``
    (all of one group)."""
    mine = pick(wanted, units)
    return Load(
        mine[0][0],
        list(map(_POSITION, mine)),
        list(map(_HASH, mine)),
        pick(blocks, units),
        transfer,
        medium,
    )
