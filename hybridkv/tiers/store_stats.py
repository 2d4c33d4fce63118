"""``StoreStats``: what the store tier sent and received, beside its ``TierStats``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class StoreStats:
    """What the store tier sent and received (monotonic; ``/metrics``'s store series)."""

    put_batches: int = 0
    get_batches: int = 0
    put_bytes: int = 0  # bytes of objects put
    get_bytes: int = 0  # bytes of objects read
    already_there: int = 0  # stores found in the store already (not sent)
    unreachable: int = 0  # stores and loads answered at once: the master was unreachable
    found_gone: int = 0  # objects this replica wrote and a check found gone (store_watch)
    sweeps: int = 0  # sweeps of the watched keys (one batch_is_exist each)
    staging_skips: int = 0  # writes skipped: the staging region had no free range for them
    staging_misses: int = 0  # loads failed: the object is larger than the read staging
    put_seconds: list[float] = field(default_factory=list)  # per put batch
    get_seconds: list[float] = field(default_factory=list)  # per get batch

    def as_dict(self) -> dict[str, int]:
        """The counters (latencies left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}
