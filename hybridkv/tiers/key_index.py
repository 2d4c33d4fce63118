"""``KeyIndex``: the block hashes a tier has entries for, one set per group.

A tier's ledger keeps it in step with its entries (reserved or committed), so
``holds_any(group, hashes)`` answers in one C-level set operation whether the
tier has an entry for any of a request's blocks: a superset test (entries in
flight count) that lets a lookup skip the tiers when they can hold nothing of
the request (``offload/tier_lookup.py``), instead of asking ``contains`` block
by block.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any


class KeyIndex:
    """Per group, the block hashes of a ledger's entries (module docstring).
    Keys are ``UnitKey``-shaped: ``(block_hash, group_id)``."""

    __slots__ = ("_groups",)

    def __init__(self) -> None:
        self._groups: dict[Any, set[Any]] = {}

    def add(self, key: Hashable) -> None:
        unit: tuple[Any, Any] = key  # type: ignore[assignment]
        self._groups.setdefault(unit[1], set()).add(unit[0])

    def discard(self, key: Hashable) -> None:
        unit: tuple[Any, Any] = key  # type: ignore[assignment]
        hashes = self._groups.get(unit[1])
        if hashes is not None:
            hashes.discard(unit[0])

    def holds_any(self, group_id: int, hashes: Iterable[bytes]) -> bool:
        """True when some ``(h, group_id)`` of ``hashes`` has an entry."""
        held = self._groups.get(group_id)
        return bool(held) and not held.isdisjoint(hashes)  # type: ignore[union-attr]

    def check_integrity(self, keys: Iterable[Hashable]) -> None:
        """The index holds exactly ``keys`` (the ledger's entries)."""
        want: dict[Any, set[Any]] = {}
        for key in keys:
            unit: tuple[Any, Any] = key  # type: ignore[assignment]
            want.setdefault(unit[1], set()).add(unit[0])
        got = {g: h for g, h in self._groups.items() if h}
        assert got == want, "the key index is out of step with the ledger"
