"""``TierIndex``: one modeled tier of ``hybridkv simulate`` (host RAM or disk).

A byte budget of hit units keyed ``(block hash, group)``, each with its size
and a *value class* (``policy.unit_class``: half-octaves of what a hit on it
saves per byte it holds here). Valued units leave in the order of
``tiers.ranking.RankedUnits``, the engine's rule too (``RankedLedger``)::

    key = bytes of valued stores so far / budget + weight * class / 2

smallest first (``weight`` 0: plain LRU, one class). Every valued store counts
its bytes on the clock, a store of a unit already held too (the device evicted
its copy again), as the device free set counts every release. A hit counts
nothing: with ``hits_to_spare`` (the host under ``hybrid``) the unit moves to
spare room, since the device now holds it and demotes it back when it evicts
it again; otherwise (the disk, or ``lru``'s write-through host) it is re-keyed
now. Each pick of a victim costs O(log n).

A unit stored with no class (``cls`` None) is *spare*
(``hybridkv/tiers/spare.py``, the engine's rule): the policy offered it for
spare room only (``SPARE``: a block ``hybrid`` released ``evict_first``). It
takes free bytes or older spare units' bytes, never a valued unit's (else it
is skipped, ``spare_skips``); spare units are every store's first victims,
least recently used first; they have no key and do not advance the clock. A
valued store of a key held as spare makes it valued; a spare store of a
valued key changes nothing.

Count first, then act: ``store`` picks every victim before it removes any,
and refuses (changes nothing) a unit larger than the whole budget. The budget
is never exceeded (``check_integrity``). The simulator's stores and loads are
instantaneous in its bookkeeping, so nothing is ever pinned here.
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from typing import NamedTuple

from hybridkv.tiers.ranking import RankedUnits
from hybridkv.tiers.spare import SpareRoom


class Unit(NamedTuple):
    """One unit held by a tier: its bytes, value class (None: spare) and
    eviction key (0.0 for a spare unit: spare units go first, in use order)."""

    nbytes: int
    cls: float | None
    key: float


class TierIndex:
    """One tier's units, budget and eviction order (module docstring)."""

    def __init__(
        self, name: str, budget_bytes: int, weight: float, hits_to_spare: bool = False
    ) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise ValueError(f"{name} budget must be an integer >= 1 byte, got {budget_bytes!r}")
        if not weight >= 0:
            raise ValueError(f"weight must be >= 0, got {weight!r}")
        self.name = name
        self.budget_bytes = budget_bytes
        self.weight = weight
        self.hits_to_spare = hits_to_spare
        self.used_bytes = 0
        self.stores = self.evictions = self.refused = 0
        self.spare_stores = self.spare_skips = 0
        self.units: dict[Hashable, Unit] = {}
        self.ranked = RankedUnits(budget_bytes, weight)
        self.spare = SpareRoom()

    @property
    def stored_bytes(self) -> int:
        """Bytes of every valued store so far: the clock of the keys."""
        return self.ranked.clock

    def __contains__(self, key: Hashable) -> bool:
        return key in self.units

    def __len__(self) -> int:
        return len(self.units)

    def touch(self, key: Hashable) -> None:
        """A hit on ``key``: a spare unit is used (last of the spare units to
        go); a valued one moves to spare room (``hits_to_spare``) or is re-keyed
        now, without counting (module docstring)."""
        unit = self.units[key]
        if unit.cls is None:
            self.spare.touch(key)
        elif self.hits_to_spare:
            self.ranked.discard(key)
            self.units[key] = Unit(unit.nbytes, None, 0.0)
            self.spare.add(key, unit.nbytes)
        else:
            self.units[key] = unit._replace(key=self.ranked.touch(key))

    def store(
        self, key: Hashable, nbytes: int, cls: float | None, pinned: Container[Hashable] = ()
    ) -> list[tuple[Hashable, Unit]] | None:
        """Hold ``key`` (``nbytes``, value class ``cls``; None: spare, module
        docstring); a key already held is stored again: a valued store counts
        its bytes on the clock and keys it now with ``cls`` (a spare key becomes
        valued), a spare store changes nothing but a spare key's use order. The
        units evicted to make room, in eviction order (never one of ``pinned``:
        units in flight in the engine), or None when nothing was stored: the
        unit is larger than the budget, it is spare and there is no spare room,
        or only ``pinned`` units could make the room."""
        unit = self.units.get(key)
        if unit is not None:
            if cls is None:
                if unit.cls is None:
                    self.spare.touch(key)
                return []
            if unit.cls is None:
                self.spare.discard(key)
            self.units[key] = Unit(unit.nbytes, cls, self.ranked.store(key, unit.nbytes, cls))
            return []
        if nbytes > self.budget_bytes:
            self.refused += 1
            return None
        victims = self._victims(nbytes, cls is None, pinned)
        if victims is None:
            if cls is None:
                self.spare_skips += 1
            else:
                self.refused += 1
            return None
        for victim, gone in victims:
            if gone.cls is None:
                self.spare.discard(victim)
            del self.units[victim]
            self.used_bytes -= gone.nbytes
        self.evictions += len(victims)
        self.used_bytes += nbytes
        self.stores += 1
        if cls is None:
            self.units[key] = Unit(nbytes, None, 0.0)
            self.spare.add(key, nbytes)
            self.spare_stores += 1
            return victims
        self.units[key] = Unit(nbytes, cls, self.ranked.store(key, nbytes, cls))
        return victims

    def _victims(
        self, needed: int, spare: bool = False, pinned: Container[Hashable] = ()
    ) -> list[tuple[Hashable, Unit]] | None:
        """The units to drop so that ``needed`` bytes are free: spare units
        first, least recently used first, then (unless ``spare``: a spare
        store, None when spare room is short) valued units in ranked order.
        Valued victims leave the order; nothing else changes."""
        free = self.budget_bytes - self.used_bytes
        if free >= needed:
            return []
        removable = (lambda k: k not in pinned) if pinned else None
        keys, freed = self.spare.victims(needed - free, removable)
        out = [(k, self.units[k]) for k in keys]
        free += freed
        if free >= needed or spare:
            return out if free >= needed else None
        units = self.units
        ranked = self.ranked.take(needed - free, lambda k: units[k].nbytes, removable)
        if ranked is None:
            assert pinned, "the budget holds the unit, so victims exist"
            return None
        return out + [(k, units[k]) for k in ranked]

    def bytes_by(self, kind_of: dict[int, str]) -> dict[str, int]:
        """Bytes held per kind, given each group's kind (``kind_of[group]``)."""
        out: dict[str, int] = {}
        for key, unit in self.units.items():
            kind = kind_of[key[1]]  # type: ignore[index]
            out[kind] = out.get(kind, 0) + unit.nbytes
        return out

    def check_integrity(self) -> None:
        """The bytes add up, the budget holds, every valued unit is ranked with
        its class and key, and every spare one is in spare room."""
        assert 0 <= self.used_bytes <= self.budget_bytes, (self.used_bytes, self.budget_bytes)
        assert self.used_bytes == sum(u.nbytes for u in self.units.values())
        self.ranked.check_integrity()
        units = self.units
        valued = {k for k, u in units.items() if u.cls is not None}
        assert len(valued) == len(self.ranked), f"{self.name}: ranked units out of step"
        for k in valued:
            assert self.ranked.class_of(k) == units[k].cls, f"{self.name}: {k!r} class"
            assert self.ranked.key_of(k) == units[k].key, f"{self.name}: {k!r} key"
        self.spare.check_integrity(
            lambda k: units[k].nbytes if k in units and units[k].cls is None else None
        )
        spare = sum(1 for u in units.values() if u.cls is None)
        assert spare == len(self.spare), (
            f"{self.name}: {spare} spare units, {len(self.spare)} queued"
        )
