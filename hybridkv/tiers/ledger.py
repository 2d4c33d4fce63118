"""``EntryLedger``: a tier's byte accounting, pins and eviction order.

Every tier keeps one. An entry is *reserved* when its store starts (its bytes
count against the budget from then on, and it is pinned by the store),
*committed* when the store completes (unpinned, servable), and gone when it
is evicted or aborted. Count first, then act: ``reserve`` picks every victim
it needs before it removes any, and returns None (changing nothing) when the
unpinned, committed entries cannot make room.

Eviction order: least recently used first (kept in use order, no sort). A
tier under ``hybrid`` keeps a ``RankedLedger`` instead (``tiers/ranked_ledger.py``:
the rule of ``tiers/ranking.py``, the simulator's too); the value comes from
the store (``TierStore.store(..., value=...)``).

Spare room (``tiers/spare.py``): an entry stored with the value ``SPARE`` is
*spare*. It takes only free bytes or older spare entries' bytes, never a
valued entry's, and spare entries are every store's first victims (least
recently used first), before the ranking's order.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hybridkv.tiers.key_index import KeyIndex
from hybridkv.tiers.spare import SpareRoom, is_spare


@dataclass(slots=True)
class EntryInfo:
    """One entry's accounting (what a ranking sees)."""

    key: Hashable
    nbytes: int
    value: float | None
    last_used: int
    pins: int = 1  # a new entry is pinned by its store
    committed: bool = False
    spare: bool = False  # stored for spare room only (``tiers/spare.py``)
    #: Where the tier keeps the entry's bytes, for a tier that sets it
    #: (``HostTier``: its buffer and parts' sizes); a pinned batch's loads read it
    #: here instead of looking each key up again. None: not kept.
    where: Any = None


class PinBatch:
    """The keys one ``LedgerTier.pin_batch`` call pinned (each once) and their
    entries (``entries[k]`` is ``keys[k]``'s: a load reads and unpins them without
    a lookup per key); ``held``: per key asked, whether the tier held it;
    ``released`` once undone or taken over."""

    __slots__ = ("entries", "held", "keys", "released")

    def __init__(self, keys: list[Any], held: list[bool], entries: list[EntryInfo]) -> None:
        self.keys = keys
        self.held = held
        self.entries = entries
        self.released = False


class EntryLedger:
    """Accounting of one tier (module docstring). Not thread-safe: the tier locks."""

    def __init__(self, budget_bytes: int, index: KeyIndex | None = None) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be an int >= 0, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[Hashable, EntryInfo] = OrderedDict()  # least recent first
        self._tick = 0
        #: The entries the last ``reserve`` evicted (for a tier that spills them).
        self.evicted: list[EntryInfo] = []
        #: Kept in step with the entries when given (``UnitKey`` keys only).
        self.index = index
        #: The spare entries, least recently used first.
        self.spare = SpareRoom()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> EntryInfo | None:
        return self._entries.get(key)

    def committed_keys(self) -> list[Hashable]:
        return [k for k, e in self._entries.items() if e.committed]

    def is_committed(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.committed

    def _victims(self, needed: int, spare: bool = False) -> list[Hashable] | None:
        """Unpinned committed keys to drop so that ``needed`` bytes are free: spare
        entries first, then (unless ``spare``: a spare store) valued ones."""
        free = self.budget_bytes - self.used_bytes
        if free >= needed:
            return []
        victims, freed = self.spare.victims(needed - free, self.removable)
        free += freed
        if free >= needed:
            return victims
        if spare:
            return None
        # use order: stop at the first entries that make room
        candidates = (
            e for e in self._entries.values() if e.committed and e.pins == 0 and not e.spare
        )
        for entry in candidates:
            victims.append(entry.key)
            free += entry.nbytes
            if free >= needed:
                return victims
        return None

    def reserve(
        self, key: Hashable, nbytes: int, value: float | None = None
    ) -> list[Hashable] | None:
        """Add ``key`` (pinned, not committed), evicting what it needs; the
        evicted keys, or None when there is no room (nothing changed). A
        ``SPARE`` value takes spare room only (module docstring)."""
        if key in self._entries:
            raise KeyError(f"{key!r} is already in the tier")
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if nbytes > self.budget_bytes:
            return None
        spare = is_spare(value)
        victims = self._victims(nbytes, spare)
        if victims is None:
            return None
        self.evicted = [self.remove(victim) for victim in victims]
        self._tick += 1
        self._entries[key] = EntryInfo(key, nbytes, value, self._tick, spare=spare)
        self.used_bytes += nbytes
        if spare:
            self.spare.add(key, nbytes)
        if self.index is not None:
            self.index.add(key, pending=True)
        return victims

    def add_committed(self, key: Hashable, nbytes: int, last_used: int = 0) -> None:
        """An entry found on restart (unpinned, committed); the caller keeps the budget."""
        self._tick = max(self._tick, last_used)
        self._entries[key] = EntryInfo(key, nbytes, None, last_used, pins=0, committed=True)
        self.used_bytes += nbytes
        if self.index is not None:
            self.index.add(key)

    def commit(self, key: Hashable) -> None:
        entry = self._entries[key]
        assert not entry.committed and entry.pins >= 1, entry
        entry.committed = True
        entry.pins -= 1
        if self.index is not None:
            self.index.commit(key)

    def pin(self, key: Hashable) -> None:
        self._entries[key].pins += 1

    def unpin(self, key: Hashable) -> None:
        entry = self._entries[key]
        if entry.pins <= (0 if entry.committed else 1):
            raise ValueError(f"unpin of {key!r}, which no pin() holds")
        entry.pins -= 1

    def pin_committed(self, keys: Sequence[Hashable]) -> None:
        """``pin`` and ``touch`` each of ``keys``, all committed (``KeyError`` naming
        the first that is not, before anything changes)."""
        entries = self._entries
        found = [entries.get(k) for k in keys]
        for k, e in zip(keys, found, strict=True):
            if e is None or not e.committed:
                raise KeyError(k)
        move = entries.move_to_end
        tick = self._tick
        for e in found:
            assert e is not None
            e.pins += 1
            tick += 1
            e.last_used = tick
            move(e.key)
            if e.spare:
                self.spare.touch(e.key)
        self._tick = tick

    def pin_held(self, keys: Sequence[Hashable]) -> list[bool]:
        """``pin`` and ``touch`` each of ``keys`` that is committed (a load's use);
        per key, whether it was pinned."""
        return [e is not None for e in self.pin_entries(keys)]

    def pin_entries(self, keys: Sequence[Hashable]) -> list[EntryInfo | None]:
        """``pin_held``, giving per key its entry, pinned (None: not committed, not
        pinned). One pass per unit; the lookups and the moves in use order are
        C-level maps (in use order: each key's tick follows the one before)."""
        entries, spare = self._entries, self.spare
        out: list[EntryInfo | None] = list(map(entries.get, keys))
        tick = self._tick
        missing = False
        for k, entry in enumerate(out):
            if entry is None or not entry.committed:
                out[k] = None
                missing = True
                continue
            entry.pins += 1
            tick += 1
            entry.last_used = tick
            if entry.spare:
                spare.touch(entry.key)
        held = [k for k, e in zip(keys, out, strict=True) if e is not None] if missing else keys
        deque(map(entries.move_to_end, held), maxlen=0)
        self._tick = tick
        return out

    def unpin_many(self, keys: Iterable[Hashable]) -> None:
        """``unpin`` each of ``keys`` (pinned by ``pin_committed`` or ``pin_held``)."""
        self.unpin_entries(map(self._entries.__getitem__, keys))

    @staticmethod
    def unpin_entries(entries: Iterable[EntryInfo]) -> None:
        """``unpin_many`` of entries pinned by ``pin_entries`` (no lookup: a pinned
        entry cannot leave the ledger)."""
        for entry in entries:
            if entry.pins <= (0 if entry.committed else 1):
                raise ValueError(f"unpin of {entry.key!r}, which no pin() holds")
            entry.pins -= 1

    def touch(self, key: Hashable) -> None:
        self._tick += 1
        entry = self._entries[key]
        entry.last_used = self._tick
        self._entries.move_to_end(key)
        if entry.spare:
            self.spare.touch(key)

    def store_again(self, key: Hashable, value: float | None) -> None:
        """A store of ``key``, which the tier holds or is storing, with ``value``:
        a committed entry is touched, except that a spare store leaves a valued
        entry alone, and a valued store makes a spare entry valued (``value``)."""
        entry = self._entries[key]
        if is_spare(value) and not entry.spare:
            return
        if entry.spare and not is_spare(value):
            entry.spare = False
            entry.value = value
            self.spare.discard(key)
        if entry.committed:
            self.touch(key)

    def remove(self, key: Hashable) -> EntryInfo:
        """Drop ``key`` (a store's abort may drop its own pinned, uncommitted entry)."""
        entry = self._entries.pop(key)
        self.used_bytes -= entry.nbytes
        if self.index is not None:
            self.index.discard(key)
        if entry.spare:
            self.spare.discard(key)
        return entry

    def removable(self, key: Hashable) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.committed and entry.pins == 0

    def pinned_keys(self) -> set[Hashable]:
        return {k for k, e in self._entries.items() if e.pins > 0}

    def check_integrity(self) -> None:
        """Bytes add up, the budget holds, pins are consistent, LRU order is sorted."""
        total = sum(e.nbytes for e in self._entries.values())
        assert total == self.used_bytes, (total, self.used_bytes)
        assert 0 <= self.used_bytes <= self.budget_bytes, (self.used_bytes, self.budget_bytes)
        if self.index is not None:
            self.index.check_integrity(self._entries)
        ticks = [e.last_used for e in self._entries.values()]
        assert ticks == sorted(ticks), "use order out of step with last_used"
        entries = self._entries
        self.spare.check_integrity(lambda k: entries[k].nbytes if k in entries else None)
        spare = [k for k, e in entries.items() if e.spare]
        assert list(self.spare) == spare, "spare entries out of step (or of use order)"
        for key, entry in self._entries.items():
            assert entry.key == key, (entry.key, key)
            assert entry.nbytes >= 0 and entry.pins >= 0, entry
            assert entry.committed or entry.pins >= 1, (
                f"an uncommitted entry has no store pin: {entry}"
            )
