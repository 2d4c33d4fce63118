"""``StoreLookup``: which of a waiting request's units the shared store holds.

The cross-tier hit rule (``tiered_hit_length``) asks "is this block present?"
block by block; the store answers over the network, so ``Loads`` asks it once
per staging instead: ``ask`` sends one ``contains_many`` for every unit of the
request's blocks (up to its lookup limit, in every group) that neither the
device nor a tier of this process holds, and ``found`` holds the answer while
the hit is worked out; ``forget`` drops it. The store may drop an entry between
this answer and its load: that load then fails and its tokens are recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.tiers import MooncakeTier, UnitKey

#: ``(group_id, block index, block hash) -> present on the device or in a local tier``.
Present = Callable[[int, int, bytes], bool]


class StoreLookup:
    """One request's units in the store (module docstring)."""

    def __init__(
        self,
        store: MooncakeTier,
        managers: Sequence[SingleTypeKVCacheManager],
        here: Present,
    ) -> None:
        self.store = store
        self.managers = managers
        self._here = here
        #: The units the store held at the last ``ask``.
        self.found: set[UnitKey] = set()
        #: Lookups sent, and the units they asked about (statistics).
        self.asked = 0
        self.asked_units = 0

    def ask(self, hashes: list[bytes], limit: int) -> None:
        """Ask the store about the units of ``hashes``' blocks up to ``limit`` tokens
        that are not here (one request)."""
        self.found = set()
        keys: list[UnitKey] = []
        for m in self.managers:
            gid, view = m.group_id, m.group_hashes(hashes)
            for i in range(min(limit // m.block_size, len(view))):
                if not self._here(gid, i, view[i]):
                    keys.append(UnitKey(view[i], gid))
        if not keys:
            return
        self.asked += 1
        self.asked_units += len(keys)
        held = self.store.contains_many(keys)
        self.found = {k for k, there in zip(keys, held, strict=True) if there}

    def forget(self) -> None:
        """Drop the last answer (it is stale once the hit is staged)."""
        self.found = set()
