"""Tiers below the device pool: host RAM, local disk and a shared store of hit units.

``TierStore`` (``base.py``) is the interface; ``HostTier`` and ``DiskTier``
implement it over one ``EntryLedger`` each; ``MooncakeTier`` (``store_tier.py``)
over a Mooncake Store shared by replicas (its client is imported on first use).
Nothing here imports torch or numpy: ``tiers/torch_memory.py`` (tensors, pinned
memory, CUDA streams) and ``tiers/slab_memory.py`` with ``tiers/rows.py`` (slots of
a slab, batches of units copied by rows) are imported by whoever gives a
``HostTier`` tensors. The design and what is wired so far: ``docs/tiers.md``.
"""

from hybridkv.tiers.base import (
    CorruptEntryError,
    TierError,
    TierFullError,
    TierStats,
    TierStore,
    UnitKey,
)
from hybridkv.tiers.disk import DiskTier
from hybridkv.tiers.fingerprint import ModelFingerprint
from hybridkv.tiers.host import HostTier
from hybridkv.tiers.ledger import EntryInfo
from hybridkv.tiers.ranking import RankRule
from hybridkv.tiers.store_tier import MooncakeTier
from hybridkv.tiers.transfer import Transfer

__all__ = [
    "CorruptEntryError",
    "DiskTier",
    "EntryInfo",
    "HostTier",
    "ModelFingerprint",
    "MooncakeTier",
    "RankRule",
    "TierError",
    "TierFullError",
    "TierStats",
    "TierStore",
    "Transfer",
    "UnitKey",
]
