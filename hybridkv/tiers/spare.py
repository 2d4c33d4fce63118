"""``SpareRoom``: the units a tier holds only in room nothing valued needs.

A cache policy offers some units to a tier with the value ``SPARE`` (0.0:
worth nothing against any valued unit). Under ``hybrid`` these are the blocks
it released ``evict_first``: no kept point needs them, and on the device they
are the free set's first reuse (``CachePolicy.demotion_value``). A tier takes
such a unit only into *spare room*:

- **Spare room** is the tier's free bytes plus the bytes of the spare units it
  already holds (and may drop). A spare unit never evicts a valued unit (any
  value other than ``SPARE``, None included); when free bytes and the older
  spare units cannot make room, the store is skipped (counted apart, no
  warning: a full tier is the normal case).
- **Spare units are the tier's first victims.** A valued store that needs room
  evicts spare units first, least recently used first, and only then valued
  units by the tier's own order. A spare unit evicted by a tier goes no
  lower (it is worth no disk write).
- **Spare units keep no clock.** They are not keyed against the tier's valued
  units, and storing one advances nothing those units are ranked by.
- **A later value wins upward only.** A valued store of a key held as spare
  makes it valued (with the new value, as if stored now); a spare store of a
  key held as valued changes nothing, not even its recency.

``SpareRoom`` is the part of this every tier runs the same way: the spare
keys in use order with their bytes, and the pick of victims among them.
``EntryLedger`` (the engine's tiers) and ``sim.tier_index.TierIndex`` (the
simulator's) each keep one beside their valued entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator

#: The value a policy offers a unit with when a tier may take it only into spare room.
SPARE = 0.0


def is_spare(value: float | None) -> bool:
    """True for a unit offered for spare room only (``value`` is ``SPARE``)."""
    return value is not None and value == SPARE


class SpareRoom:
    """A tier's spare units, least recently used first, with their bytes."""

    def __init__(self) -> None:
        self._units: OrderedDict[Hashable, int] = OrderedDict()
        self.nbytes = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._units

    def __len__(self) -> int:
        return len(self._units)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._units)

    def add(self, key: Hashable, nbytes: int) -> None:
        assert key not in self._units, f"{key!r} is already spare"
        self._units[key] = nbytes
        self.nbytes += nbytes

    def discard(self, key: Hashable) -> None:
        nbytes = self._units.pop(key, None)
        if nbytes is not None:
            self.nbytes -= nbytes

    def touch(self, key: Hashable) -> None:
        """A use of the spare ``key``: it leaves last among the spare units."""
        self._units.move_to_end(key)

    def victims(
        self, short: int, removable: Callable[[Hashable], bool] | None = None
    ) -> tuple[list[Hashable], int]:
        """Spare keys to drop, least recently used first, until they free ``short``
        bytes or run out (``removable``: which keys may go; None: all). Picked,
        not removed: ``(keys, their bytes)``; the bytes are below ``short`` when
        the spare units cannot make the room."""
        out: list[Hashable] = []
        freed = 0
        if short <= 0:
            return out, freed
        for key, nbytes in self._units.items():
            if removable is not None and not removable(key):
                continue
            out.append(key)
            freed += nbytes
            if freed >= short:
                break
        return out, freed

    def check_integrity(self, held: Callable[[Hashable], int | None]) -> None:
        """Each spare key is held with its bytes (``held(key)``: its bytes in the
        tier, None if absent), and the bytes add up."""
        assert self.nbytes == sum(self._units.values()), "spare bytes out of step"
        for key, nbytes in self._units.items():
            assert held(key) == nbytes, f"spare {key!r}: {nbytes} bytes, tier says {held(key)}"
