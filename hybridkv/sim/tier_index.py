"""``TierIndex``: one modeled tier of ``hybridkv simulate`` (host RAM or disk).

A byte budget of hit units keyed ``(block hash, group)``, each with its size
and a *value class* (``policy.cost_aware.value_class`` of what a hit on it
saves per byte it holds here). Its eviction order is the device free set's
rule (``CostAwareEvictionPolicy``) in bytes::

    key = bytes stored in this tier so far / budget + weight * class / 2

and the unit with the smallest key leaves first. ``weight`` 0 is plain LRU
(one class). Every valued store counts its bytes on the clock, a store of a
unit already held too (the device evicted its copy again): the free set's
clock counts every release, a block released again after a hit included. A
clock that skipped those ran slower than the device's wherever the host's
units come back, so the value term outweighed recency there: on the whole
Mooncake conversation trace (jamba-v0.1, 40 GB + 160 GB) old units of a
high class held the host while newer ones, which the same bytes on the
device keep, were evicted (``benchmarks/results/tiers-sim.md``). A hit
(``touch``) re-keys a unit without counting: on the device a hit takes the
block out of the free set, and only its release counts.

Keys only grow within a class, so each class is an LRU queue and an
eviction looks at the class heads only: O(classes) per evicted unit.

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

import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import NamedTuple

from hybridkv.tiers.spare import SpareRoom


class Unit(NamedTuple):
    """One unit held by a tier: its bytes, value class (None: spare) and
    eviction key (0.0 for a spare unit: spare units go first, in use order)."""

    nbytes: int
    cls: int | None
    key: float


class TierIndex:
    """One tier's units, budget and eviction order (module docstring)."""

    def __init__(self, name: str, budget_bytes: int, weight: float) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise ValueError(f"{name} budget must be an integer >= 1 byte, got {budget_bytes!r}")
        if not weight >= 0:
            raise ValueError(f"weight must be >= 0, got {weight!r}")
        self.name = name
        self.budget_bytes = budget_bytes
        self.weight = weight
        self.used_bytes = 0
        self.stored_bytes = 0  # bytes of every valued store: the clock of the keys
        self.stores = self.evictions = self.refused = 0
        self.spare_stores = self.spare_skips = 0
        self.units: dict[Hashable, Unit] = {}
        self.classes: dict[int, OrderedDict[Hashable, None]] = {}
        self.spare = SpareRoom()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.units

    def __len__(self) -> int:
        return len(self.units)

    def _key(self, cls: int) -> float:
        return self.stored_bytes / self.budget_bytes + self.weight * cls / 2

    def touch(self, key: Hashable, cls: int | None = None) -> None:
        """A hit on ``key`` (or a new copy of it, of class ``cls``): it is
        re-queued as if stored now, without using bytes (a spare unit: last of
        the spare units to go)."""
        unit = self.units[key]
        if unit.cls is None and cls is None:
            self.spare.touch(key)
            return
        new_cls = unit.cls if cls is None else cls
        assert new_cls is not None
        self._unqueue(key, unit.cls)
        self.units[key] = Unit(unit.nbytes, new_cls, self._key(new_cls))
        self.classes.setdefault(new_cls, OrderedDict())[key] = None

    def _unqueue(self, key: Hashable, cls: int | None) -> None:
        if cls is None:
            self.spare.discard(key)
            return
        queue = self.classes[cls]
        del queue[key]
        if not queue:
            del self.classes[cls]

    def store(
        self, key: Hashable, nbytes: int, cls: int | None
    ) -> list[tuple[Hashable, Unit]] | None:
        """Hold ``key`` (``nbytes``, value class ``cls``; None: spare, module
        docstring); a key already held is touched instead, its bytes counted on
        the clock as any valued store's (a spare store of a valued key:
        nothing; a valued store of a spare key makes it valued, as if stored
        now). The units evicted to make room, in eviction order, or
        None when nothing was stored: the unit is larger than the budget, or it
        is spare and there is no spare room."""
        unit = self.units.get(key)
        if unit is not None:
            if cls is None and unit.cls is not None:
                return []
            if cls is not None:
                self.stored_bytes += unit.nbytes
            self.touch(key, cls)
            return []
        if nbytes > self.budget_bytes:
            self.refused += 1
            return None
        victims = self._victims(nbytes, spare=cls is None)
        if victims is None:
            self.spare_skips += 1
            return None
        for victim, unit in victims:
            self._unqueue(victim, unit.cls)
            del self.units[victim]
            self.used_bytes -= unit.nbytes
        self.evictions += len(victims)
        self.used_bytes += nbytes
        self.stores += 1
        if cls is None:
            self.units[key] = Unit(nbytes, None, 0.0)
            self.spare.add(key, nbytes)
            self.spare_stores += 1
            return victims
        self.stored_bytes += nbytes
        self.units[key] = Unit(nbytes, cls, self._key(cls))
        self.classes.setdefault(cls, OrderedDict())[key] = None
        return victims

    def _victims(self, needed: int, spare: bool = False) -> list[tuple[Hashable, Unit]] | None:
        """The units to drop so that ``needed`` bytes are free (picked without
        removing any): spare units first, least recently used first, then
        (unless ``spare``: a spare store, None when spare room is short) valued
        units, smallest key first."""
        free = self.budget_bytes - self.used_bytes
        if free >= needed:
            return []
        keys, freed = self.spare.victims(needed - free)
        out = [(k, self.units[k]) for k in keys]
        free += freed
        if free >= needed:
            return out
        if spare:
            return None
        heads = {cls: iter(q) for cls, q in self.classes.items()}
        nxt = {cls: next(it) for cls, it in heads.items()}
        while free < needed:
            best_cls, best = None, math.inf
            for cls, key in nxt.items():
                k = self.units[key].key
                if k < best or (k == best and best_cls is not None and cls < best_cls):
                    best_cls, best = cls, k
            assert best_cls is not None, "the budget holds the unit, so victims exist"
            key = nxt[best_cls]
            unit = self.units[key]
            out.append((key, unit))
            free += unit.nbytes
            following = next(heads[best_cls], None)
            if following is None:
                del nxt[best_cls]
            else:
                nxt[best_cls] = following
        return out

    def bytes_by(self, kind_of: dict[int, str]) -> dict[str, int]:
        """Bytes held per kind, given each group's kind (``kind_of[group]``)."""
        out: dict[str, int] = {}
        for key, unit in self.units.items():
            kind = kind_of[key[1]]  # type: ignore[index]
            out[kind] = out.get(kind, 0) + unit.nbytes
        return out

    def check_integrity(self) -> None:
        """The bytes add up, the budget holds, every unit is queued once in its
        class (or, spare, in the spare units) and each class's keys do not
        decrease."""
        assert 0 <= self.used_bytes <= self.budget_bytes, (self.used_bytes, self.budget_bytes)
        assert self.used_bytes == sum(u.nbytes for u in self.units.values())
        queued = 0
        for cls, queue in self.classes.items():
            assert queue, f"{self.name}: empty class {cls} kept"
            last = -math.inf
            for key in queue:
                unit = self.units[key]
                assert unit.cls == cls, f"{self.name}: {key!r} queued in {cls}, says {unit.cls}"
                assert unit.key >= last, f"{self.name}: class {cls} keys out of order"
                last = unit.key
            queued += len(queue)
        units = self.units
        self.spare.check_integrity(
            lambda k: units[k].nbytes if k in units and units[k].cls is None else None
        )
        spare = sum(1 for u in units.values() if u.cls is None)
        assert spare == len(self.spare), (
            f"{self.name}: {spare} spare units, {len(self.spare)} queued"
        )
        queued += spare
        assert queued == len(units), f"{self.name}: {queued} queued, {len(units)} held"
