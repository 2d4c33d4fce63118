"""``RankedLedger``: an ``EntryLedger`` whose valued entries leave in the order
of ``tiers.ranking`` (the simulator's ``TierIndex`` runs the same rule).

The ledger keeps the bytes, pins, commits and spare room; this keeps the
order of the valued entries beside them (``RankedUnits``) and tells it each
event the rule counts:

- a valued store (``reserve``), a store again (``store_again``) and an entry
  found on restart (``add_committed``, at the neutral value) count their bytes
  on the clock and key the entry now, at ``rule.classify(value, nbytes)``;
- a use (``touch``, ``pin_committed``, ``pin_held``: a load) is a hit: the
  entry is re-keyed now, or with ``rule.hits_to_spare`` (the host under
  ``hybrid``) moved to spare room until the device demotes it again;
- a spare entry is not ranked; spare entries stay every store's first victims.

A victim is the smallest key among the committed, unpinned valued entries
(pinned ones are skipped and keep their place): O(log n) per victim.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from hybridkv.tiers.key_index import KeyIndex
from hybridkv.tiers.ledger import EntryInfo, EntryLedger
from hybridkv.tiers.ranking import RankedUnits, RankRule
from hybridkv.tiers.spare import is_spare


class RankedLedger(EntryLedger):
    """Accounting of one ranked tier (module docstring). Not thread-safe: the tier locks."""

    def __init__(self, budget_bytes: int, rule: RankRule, index: KeyIndex | None = None) -> None:
        super().__init__(budget_bytes, index)
        self.rule = rule
        self.ranked = RankedUnits(max(1, budget_bytes), rule.weight)

    def _rank(self, key: Hashable, nbytes: int, value: float | None) -> None:
        self.ranked.store(key, nbytes, self.rule.classify(value, nbytes))

    def _hit(self, key: Hashable) -> None:
        entry = self._entries[key]
        if entry.spare:
            self.spare.touch(key)
        elif self.rule.hits_to_spare:
            self.ranked.discard(key)
            entry.spare = True
            self.spare.add(key, entry.nbytes)
        else:
            self.ranked.touch(key)

    def _victims(self, needed: int, spare: bool = False) -> list[Hashable] | None:
        """Unpinned committed keys to drop so that ``needed`` bytes are free: spare
        entries first, then (unless ``spare``: a spare store) valued ones by rank."""
        free = self.budget_bytes - self.used_bytes
        if free >= needed:
            return []
        victims, freed = self.spare.victims(needed - free, self.removable)
        free += freed
        if free >= needed or spare:
            return victims if free >= needed else None
        entries = self._entries
        ranked = self.ranked.take(needed - free, lambda k: entries[k].nbytes, self.removable)
        return None if ranked is None else victims + ranked

    def reserve(
        self, key: Hashable, nbytes: int, value: float | None = None
    ) -> list[Hashable] | None:
        victims = super().reserve(key, nbytes, value)
        if victims is not None and not is_spare(value):
            self._rank(key, nbytes, value)
        return victims

    def add_committed(self, key: Hashable, nbytes: int, last_used: int = 0) -> None:
        super().add_committed(key, nbytes, last_used)
        self._rank(key, nbytes, None)

    def store_again(self, key: Hashable, value: float | None) -> None:
        """A store of ``key``, held or being stored, with ``value``: a spare store
        of a valued entry changes nothing; a valued store makes a spare entry
        valued, counts on the clock and keys the entry now (a committed entry
        moves last in use order)."""
        entry = self._entries[key]
        if is_spare(value):
            if entry.spare and entry.committed:
                EntryLedger.touch(self, key)
            return
        entry.value = value  # what a spill to a lower tier takes with it
        if entry.spare:
            entry.spare = False
            self.spare.discard(key)
        if entry.committed:
            EntryLedger.touch(self, key)
        self._rank(key, entry.nbytes, value)

    def touch(self, key: Hashable) -> None:
        super().touch(key)
        self._hit(key)

    def pin_committed(self, keys: Sequence[Hashable]) -> None:
        super().pin_committed(keys)
        for k in keys:
            self._hit(k)

    def pin_entries(self, keys: Sequence[Hashable]) -> list[EntryInfo | None]:
        found = super().pin_entries(keys)
        for k, e in zip(keys, found, strict=True):
            if e is not None:
                self._hit(k)
        return found

    def remove(self, key: Hashable) -> EntryInfo:
        entry = super().remove(key)
        self.ranked.discard(key)
        return entry

    def check_integrity(self) -> None:
        """The ledger's checks, and every valued entry ranked, no other."""
        super().check_integrity()
        self.ranked.check_integrity()
        valued = [k for k, e in self._entries.items() if not e.spare]
        assert len(valued) == len(self.ranked), "ranked entries out of step with the ledger"
        assert all(k in self.ranked for k in valued), "a valued entry is not ranked"


def ledger_for(
    budget_bytes: int, rule: RankRule | None, index: KeyIndex | None = None
) -> EntryLedger:
    """A tier's ledger: plain LRU without a rule (``lru``), else ranked."""
    if rule is None:
        return EntryLedger(budget_bytes, index)
    return RankedLedger(budget_bytes, rule, index)
