"""``OffloadStats``: what the tiers under one engine did (monotonic counters).

Per-tier counters (stores, evictions, corrupt entries removed, ...) are each
tier's own ``TierStats``; these count the engine's side: units demoted,
written through, swapped and spilled, hits restored (or skipped) and the
tokens they saved, loads by medium, each restored hit's load latency and the
time the scheduler blocked on loads, and the time finished outputs waited for
their store writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class OffloadStats:
    """Counters of a ``TieredCache`` (module docstring)."""

    demoted: int = 0  # units offered to the host tier by the pool's evictions
    spilled: int = 0  # units the host evicted, handed to the disk tier
    spill_failures: int = 0  # units the host evicted that could not be handed over
    hits: int = 0  # requests whose tier hit was restored whole
    hit_tokens: int = 0  # tokens past the device hit those requests did not recompute
    disk_hits: int = 0  # of ``hits``, those that loaded a unit from the disk tier
    disk_hit_tokens: int = 0  # their ``hit_tokens``
    loads_cpu: int = 0  # units loaded from the host tier
    loads_disk: int = 0  # units loaded from the disk tier
    loads_store: int = 0  # units loaded from the store tier
    store_hits: int = 0  # of ``hits``, those that loaded a unit from the store tier
    store_hit_tokens: int = 0  # their ``hit_tokens``
    store_writes: int = 0  # freed units handed to the store tier (``StoreWrites``)
    bytes_loaded: int = 0  # unit bytes of the loads that landed
    load_failures: int = 0  # units whose load failed (their tokens recomputed)
    skipped_no_room: int = 0  # tier hits not restored: the device pool had no room
    skipped_slower: int = 0  # tier hits not restored: recomputing was estimated cheaper
    written_through: int = 0  # units stored as computed (a write-through policy)
    swaps: int = 0  # preempted requests whose units went to the host tier
    swapped_units: int = 0  # units those swaps stored (the others were in a tier)
    swapped_tokens: int = 0  # tokens their swap points restore, if every unit stays
    swaps_declined: int = 0  # preemptions the cost model left to recompute
    swaps_unneeded: int = 0  # preemptions whose units the pool's reuse would not lose
    load_wait_seconds: float = 0.0  # time the scheduler blocked on tier loads
    store_waits: int = 0  # finished outputs held for the store writes in flight (``WriteBarrier``)
    store_wait_seconds: float = 0.0  # their time held
    store_late: int = 0  # of ``store_waits``, those let go with writes still in flight
    #: Per restored hit: from the decision to load it (before its units are pinned
    #: and its blocks taken) to its blocks entered in the device prefix index and
    #: let go (cached and free: the request's lookup adopts them).
    load_seconds: list[float] = field(default_factory=list)

    def count_load(self, medium: str, nbytes: int, units: int = 1) -> None:
        """``units`` units (``nbytes`` in all) from the ``medium`` tier ("CPU",
        "DISK", "STORE") landed."""
        self.bytes_loaded += nbytes
        if medium == "DISK":
            self.loads_disk += units
        elif medium == "STORE":
            self.loads_store += units
        else:
            self.loads_cpu += units
