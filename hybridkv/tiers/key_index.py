"""``KeyIndex``: the block hashes a tier has entries for, one set per group.

A tier's ledger keeps it in step with its entries (reserved or committed), so
``holds_any(group, hashes)`` answers in one C-level set operation whether the
tier has an entry for any of a request's blocks: a superset test (entries in
flight count) that lets a lookup skip the tiers when they can hold nothing of
the request (``offload/tier_lookup.py``), instead of asking ``contains`` block
by block. It also keeps the entries not committed yet (stores in flight), so
``committed(group, hashes)`` is the blocks ``contains`` holds, in two set
operations (a hit's lookup, ``offload/loading.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any


class KeyIndex:
    """Per group, the block hashes of a ledger's entries, and of those not committed
    yet (module docstring). Keys are ``UnitKey``-shaped: ``(block_hash, group_id)``."""

    __slots__ = ("_groups", "_pending")

    def __init__(self) -> None:
        self._groups: dict[Any, set[Any]] = {}
        self._pending: dict[Any, set[Any]] = {}  # of those, the entries not committed

    def add(self, key: Hashable, pending: bool = False) -> None:
        """An entry for ``key``; ``pending``: not committed yet (``commit`` it later)."""
        unit: tuple[Any, Any] = key  # type: ignore[assignment]
        self._groups.setdefault(unit[1], set()).add(unit[0])
        if pending:
            self._pending.setdefault(unit[1], set()).add(unit[0])

    def commit(self, key: Hashable) -> None:
        unit: tuple[Any, Any] = key  # type: ignore[assignment]
        self._pending[unit[1]].discard(unit[0])

    def discard(self, key: Hashable) -> None:
        unit: tuple[Any, Any] = key  # type: ignore[assignment]
        for index in (self._groups, self._pending):
            hashes = index.get(unit[1])
            if hashes is not None:
                hashes.discard(unit[0])

    def holds_any(self, group_id: int, hashes: Iterable[bytes]) -> bool:
        """True when some ``(h, group_id)`` of ``hashes`` has an entry."""
        held = self._groups.get(group_id)
        return bool(held) and not held.isdisjoint(hashes)  # type: ignore[union-attr]

    def committed(self, group_id: int, hashes: Iterable[bytes]) -> set[bytes]:
        """The ``h`` of ``hashes`` whose ``(h, group_id)`` entry is committed (set
        operations, no per-key call)."""
        held = self._groups.get(group_id)
        if not held:
            return set()
        return held.intersection(hashes) - self._pending.get(group_id, set())

    def check_integrity(self, entries: Mapping[Hashable, Any]) -> None:
        """The index holds exactly the keys of ``entries`` (the ledger's; each with a
        ``committed`` flag), and as pending those not committed."""
        want: dict[Any, set[Any]] = {}
        pending: dict[Any, set[Any]] = {}
        for key, entry in entries.items():
            unit: tuple[Any, Any] = key  # type: ignore[assignment]
            want.setdefault(unit[1], set()).add(unit[0])
            if not entry.committed:
                pending.setdefault(unit[1], set()).add(unit[0])
        got = {g: h for g, h in self._groups.items() if h}
        assert got == want, "the key index is out of step with the ledger"
        got = {g: h for g, h in self._pending.items() if h}
        assert got == pending, "the key index's pending entries are out of step with the ledger"
