"""How a tier under ``hybrid`` ranks its valued units: one rule for the engine
(``RankedLedger``) and the simulator (``sim.tier_index.TierIndex``).

Each valued unit has a *value class* (half-octaves of what a hit on it saves
per byte it holds, ``policy.unit_class``) and an eviction key, the device free
set's rule (``CostAwareEvictionPolicy``) counted in the tier's bytes::

    key = bytes of valued stores so far / budget + weight * class / 2

The unit with the smallest key goes first; equal keys: the lower class, then
the one keyed earlier. ``weight`` 0 is plain LRU.

- **A valued store counts its bytes on the clock**, a store of a unit already
  held too (the device evicted its copy again): the free set's clock counts
  every release, a block released again after a hit included.
- **A hit counts nothing.** What it does to the unit is the tier's
  ``RankRule.hits_to_spare``:

  - False (a tier below which a hit is served from, the disk): the unit is
    re-keyed now, as if stored now without counting.
  - True (the host, under ``hybrid``): the unit leaves the ranked units and is
    kept in spare room only (``tiers/spare.py``: the first victim, never in
    place of a valued unit). A hit loads it onto the device, and the device
    demotes it back to the host when it evicts it again, which makes it valued
    (a valued store of a spare key). Until then a valued copy in the host would
    hold bytes twice for one unit: on the multi-round QA workload, llama-4-scout
    at 40 GB + 80 GB lost 2.7 points of hit rate to such copies
    (``benchmarks/results/tiers-sim.md``).

Spare units (``SPARE``) are not ranked here: ``SpareRoom`` keeps them, and
they are every store's first victims.

``RankedUnits`` is the order: a heap of ``(key, class, sequence, unit)`` (a class
may be fractional: ``policy.tier_value_class``) with
lazy deletion (a re-keyed unit leaves a stale entry, skipped when popped), so
a unit may be keyed out of order (a hit, a store again) in O(log n).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RankRule:
    """A tier's ranking (module docstring): the value weight (the device free
    set's), how a stored value becomes a class (``classify(value, nbytes)``; a
    value of None ranks as the free set's neutral value), and what a hit does."""

    weight: float
    classify: Callable[[float | None, int], float]
    hits_to_spare: bool = False

    def __post_init__(self) -> None:
        if not self.weight >= 0:
            raise ValueError(f"RankRule.weight must be >= 0, got {self.weight!r}")


class RankedUnits:
    """The valued units of one tier, in eviction order (module docstring)."""

    __slots__ = ("_heap", "_live", "_seq", "budget_bytes", "clock", "weight")

    def __init__(self, budget_bytes: int, weight: float) -> None:
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self.weight = weight
        self.clock = 0  # bytes of every valued store so far
        self._seq = 0
        self._live: dict[Hashable, tuple[float, float, int]] = {}  # unit -> (key, class, seq)
        self._heap: list[tuple[float, float, int, Hashable]] = []

    def __contains__(self, unit: Hashable) -> bool:
        return unit in self._live

    def __len__(self) -> int:
        return len(self._live)

    def key_now(self, cls: float) -> float:
        return self.clock / self.budget_bytes + self.weight * cls / 2

    def class_of(self, unit: Hashable) -> float:
        return self._live[unit][1]

    def key_of(self, unit: Hashable) -> float:
        return self._live[unit][0]

    def store(self, unit: Hashable, nbytes: int, cls: float) -> float:
        """A valued store of ``unit`` (new or again): its bytes count on the
        clock, then it is keyed now with class ``cls``. Its key."""
        self.clock += nbytes
        return self._push(unit, cls)

    def touch(self, unit: Hashable) -> float:
        """A hit on ``unit`` kept ranked: re-keyed now, nothing counted. Its key."""
        return self._push(unit, self._live[unit][1])

    def discard(self, unit: Hashable) -> None:
        self._live.pop(unit, None)

    def _push(self, unit: Hashable, cls: float) -> float:
        key = self.key_now(cls)
        self._seq += 1
        self._live[unit] = (key, cls, self._seq)
        heapq.heappush(self._heap, (key, cls, self._seq, unit))
        if len(self._heap) > 2 * len(self._live) + 64:  # drop the stale entries
            live = self._live
            self._heap = [e for e in self._heap if live.get(e[3], (0, 0, -1))[2] == e[2]]
            heapq.heapify(self._heap)
        return key

    def take(
        self,
        short: int,
        nbytes_of: Callable[[Hashable], int],
        removable: Callable[[Hashable], bool] | None = None,
    ) -> list[Hashable] | None:
        """The units to evict, smallest key first, until they free ``short``
        bytes (``removable``: which may go; None: all). They leave the order
        (the caller removes them); None when they cannot make the room, and
        then nothing changed."""
        heap, live = self._heap, self._live
        out: list[Hashable] = []
        kept: list[tuple[float, float, int, Hashable]] = []
        freed = 0
        while freed < short and heap:
            entry = heapq.heappop(heap)
            unit = entry[3]
            if live.get(unit, (0, 0, -1))[2] != entry[2]:
                continue  # stale: the unit was keyed again or left
            kept.append(entry)
            if removable is not None and not removable(unit):
                continue
            out.append(unit)
            freed += nbytes_of(unit)
        if freed < short:
            for entry in kept:
                heapq.heappush(heap, entry)
            return None
        gone = set(out)
        for entry in kept:
            if entry[3] in gone:
                del live[entry[3]]
            else:
                heapq.heappush(heap, entry)
        return out

    def check_integrity(self) -> None:
        """Every unit has exactly one live heap entry, with its key."""
        live = {e[3]: (e[0], e[1], e[2]) for e in self._heap if self._live.get(e[3]) == e[:3]}
        assert live == self._live, "ranked units out of step with their heap"
