"""Whether the tiers can add anything to a request's hit: one set test per group.

``Loads`` finds a request's hit across the device and the tiers with the
coordinator's fixed point, asking of each block whether the device or a tier
holds it. When no tier has an entry for any of the request's blocks, that
question has the device's answer for every block, so the hit is the device's
own and there is nothing to load: ``tiers_may_hold`` says so with one set
operation per group and tier (``LedgerTier.holds_any``) instead of the two
fixed points, so a tier that holds only other requests' units costs an
admission almost nothing. It changes no decision: a True only sends the
lookup on to the fixed points. Those then ask ``presence``'s two tests: each
group's blocks on the device and in each tier found first with set operations
(``LedgerTier.committed_hashes``: one lock per tier and group), then one set
test per block.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hybridkv.coordinators.tiered_hit import Present
from hybridkv.managers.base import SingleTypeKVCacheManager
from hybridkv.tiers import UnitKey
from hybridkv.tiers.ledger_tier import LedgerTier


def tiers_may_hold(
    managers: Sequence[SingleTypeKVCacheManager],
    tiers: Sequence[LedgerTier | None],
    block_hashes: list[bytes],
    max_length: int,
) -> bool:
    """False when no tier has an entry for any block of a hit of at most
    ``max_length`` tokens (the blocks the fixed point may ask about)."""
    for m in managers:
        hashes = m.group_hashes(block_hashes)[: max_length // m.block_size]
        if hashes and any(t is not None and t.holds_any(m.group_id, hashes) for t in tiers):
            return True
    return False


def presence(
    cached: Sequence[Mapping[bytes, Any]],
    managers: Sequence[SingleTypeKVCacheManager],
    tiers: Sequence[LedgerTier],
    found: Collection[UnitKey],
    block_hashes: list[bytes],
) -> tuple[Present, Present]:
    """``(present, on_device)`` for one lookup of ``block_hashes``: a block is
    present when the device index (``cached``, per group) holds it, a tier holds
    its unit committed, or the store's lookup ``found`` it; on the device when
    the device index does."""
    device: dict[int, set[bytes]] = {}
    anywhere: dict[int, set[bytes]] = {}
    for m in managers:
        gid, view = m.group_id, m.group_hashes(block_hashes)
        here = device[gid] = cached[gid].keys() & view
        there = anywhere[gid] = set(here)
        for tier in tiers:
            there |= tier.committed_hashes(gid, view)
        if found:
            there.update(h for h in view if UnitKey(h, gid) in found)
    return (lambda g, _i, h: h in anywhere[g]), (lambda g, _i, h: h in device[g])
