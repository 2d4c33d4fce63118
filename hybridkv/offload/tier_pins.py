"""``TierPins``: a hit's units pinned in the tiers that hold them, before its blocks are taken.

Taking blocks from the device pool may demote what it reuses into the host
tier, which may evict host entries to make room: the units a hit is about to
load must not be among them. So each unit key is pinned first, in the highest
tier that holds it, with one call per tier (``LedgerTier.pin_batch``: one lock,
one pass; the store tier: the keys its lookup found, one ``pin`` each)::

    keys    [k0  k1  k2  k3  k4]
    where   [ 0   0   1  -1   0]      tier 0 (host), 1 (disk), -1: in none

The host tier's batch may be handed to its load (``HostTier.load_rows(pins=)``),
whose transfers take its pins over; ``release()`` undoes every pin no load
took over (a load pins what it reads by itself).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hybridkv.tiers import TierStore, UnitKey
from hybridkv.tiers.ledger import PinBatch
from hybridkv.tiers.ledger_tier import LedgerTier


class TierPins:
    """Each key pinned in the highest of ``tiers`` that holds it (module docstring).

    ``store``: the tier (if any) asked through ``found`` (its lookup's answer)
    rather than ``pin_batch``. ``where[j]``: the index in ``tiers`` of the tier
    pinning ``keys[j]``, -1 when none holds it. ``batches[k]``: tier ``k``'s
    ``PinBatch`` (None for the store, or a tier not asked).
    """

    def __init__(
        self,
        tiers: Sequence[TierStore],
        keys: list[UnitKey],
        store: TierStore | None = None,
        found: Collection[UnitKey] = (),
    ) -> None:
        self.tiers = tiers
        self.where = [-1] * len(keys)
        self.batches: list[PinBatch | None] = [None] * len(tiers)
        self._store = store
        self._store_keys: list[UnitKey] = []
        todo: Sequence[int] = range(len(keys))
        try:
            for k, tier in enumerate(tiers):
                if not todo:
                    break
                asked = keys if len(todo) == len(keys) else [keys[i] for i in todo]
                if tier is store:
                    held = [key in found for key in asked]
                    for key, h in zip(asked, held, strict=True):
                        if h:
                            tier.pin(key)
                            self._store_keys.append(key)
                else:
                    assert isinstance(tier, LedgerTier), type(tier).__name__
                    batch = self.batches[k] = tier.pin_batch(asked)
                    held = batch.held
                if all(held):  # the common case: this tier holds every key left
                    for i in todo:
                        self.where[i] = k
                    break
                rest = []
                for i, h in zip(todo, held, strict=True):
                    if h:
                        self.where[i] = k
                    else:
                        rest.append(i)
                todo = rest
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Undo every pin that no load took over."""
        for tier, batch in zip(self.tiers, self.batches, strict=True):
            if batch is not None and not batch.released:
                assert isinstance(tier, LedgerTier)
                tier.unpin_batch(batch)
        if self._store is not None:
            for key in self._store_keys:
                self._store.unpin(key)
        self._store_keys = []
