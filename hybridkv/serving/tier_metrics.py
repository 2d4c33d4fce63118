"""``TierMetrics``: the KV tiers' series on ``GET /metrics`` (with ``--kv-offloading-size``
or ``--kv-store``).

Every series has the labels ``model_name`` and ``medium`` ("CPU": the host
tier, "DISK": the disk tier, vLLM's ``BlockStored.medium`` names; "STORE": the
store replicas share, whose own series are ``store_metrics.py``'s):

- counters ``kv_tier_hits`` (requests whose tier hit was restored whole, by the
  lowest tier a unit came from), ``kv_tier_hit_tokens`` (their tokens past the
  device hit), ``kv_tier_loads`` / ``kv_tier_stores`` (units),
  ``kv_tier_corrupt_entries_removed`` (entries dropped by a header or checksum
  check);
- gauge ``kv_tier_used_bytes`` (the store: bytes waiting in its write queue);
- histogram ``kv_tier_load_seconds`` (per restored hit: from the decision to load
  it to its blocks indexed and usable; label ``model_name`` only);
- counters ``kv_tier_load_wait_seconds`` (time the scheduler blocked on tier
  loads, its steps' ``load_wait``) and ``kv_tier_swaps`` (preempted requests
  swapped out to the host tier); label ``model_name`` only.

The engine's ``OffloadStats`` and each tier's ``TierStats`` only grow; each
``refresh`` (the engine thread, at a scrape) adds what they gained since the last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridkv.offload import TieredCache

P = "hybridkv:"
MEDIA = ("CPU", "DISK", "STORE")
_LOAD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_COUNTERS = {
    "kv_tier_hits": "Requests whose tier hit was restored whole.",
    "kv_tier_hit_tokens": "Tokens past the device hit that tier hits restored.",
    "kv_tier_loads": "Units loaded from the tier.",
    "kv_tier_stores": "Units stored in the tier.",
    "kv_tier_corrupt_entries_removed": "Tier entries removed by a header or checksum check.",
}


def _counts(tiers: TieredCache) -> dict[tuple[str, str], int]:
    """Every counter's current total, by ``(name, medium)``."""
    s = tiers.stats
    out = {
        ("kv_tier_hits", "CPU"): s.hits - s.disk_hits - s.store_hits,
        ("kv_tier_hits", "DISK"): s.disk_hits,
        ("kv_tier_hits", "STORE"): s.store_hits,
        ("kv_tier_hit_tokens", "CPU"): s.hit_tokens - s.disk_hit_tokens - s.store_hit_tokens,
        ("kv_tier_hit_tokens", "DISK"): s.disk_hit_tokens,
        ("kv_tier_hit_tokens", "STORE"): s.store_hit_tokens,
        ("kv_tier_loads", "CPU"): s.loads_cpu,
        ("kv_tier_loads", "DISK"): s.loads_disk,
        ("kv_tier_loads", "STORE"): s.loads_store,
    }
    for medium, tier in _tiers(tiers):
        stores = tier.stats.stores if tier is not None else 0
        corrupt = tier.stats.corrupt_removed if tier is not None else 0
        out["kv_tier_stores", medium] = stores
        out["kv_tier_corrupt_entries_removed", medium] = corrupt
    return out


def _tiers(tiers: TieredCache) -> list[tuple[str, Any]]:
    return [("CPU", tiers.host), ("DISK", tiers.disk), ("STORE", tiers.store)]


class TierMetrics:
    """The tier series of one server's registry (module docstring)."""

    def __init__(self, registry: Any, model_name: str) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ["model_name", "medium"]
        self._name = model_name
        self._counters = {
            name: Counter(P + name, doc, labels, registry=registry)
            for name, doc in _COUNTERS.items()
        }
        self._used = Gauge(
            P + "kv_tier_used_bytes", "Bytes a tier holds.", labels, registry=registry
        )
        self._load = Histogram(
            P + "kv_tier_load_seconds",
            "Per restored tier hit: from the decision to load it to its blocks usable.",
            ["model_name"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        for medium in MEDIA:  # every series from the start, at 0
            for counter in self._counters.values():
                counter.labels(model_name, medium)
            self._used.labels(model_name, medium)
        self._load.labels(model_name)
        self._wait = Counter(
            P + "kv_tier_load_wait_seconds",
            "Seconds the scheduler blocked on tier loads.",
            ["model_name"],
            registry=registry,
        )
        self._swaps = Counter(
            P + "kv_tier_swaps",
            "Preempted requests whose units were swapped out to the host tier.",
            ["model_name"],
            registry=registry,
        )
        self._wait.labels(model_name)
        self._swaps.labels(model_name)
        self._last_wait, self._last_swaps = 0.0, 0
        self._last: dict[tuple[str, str], int] = {}
        self._seen_loads = 0

    def refresh(self, tiers: TieredCache) -> None:
        """Add what the tiers counted since the last call; set the gauges."""
        name = self._name
        for (counter, medium), total in _counts(tiers).items():
            gained = total - self._last.get((counter, medium), 0)
            if gained:
                self._counters[counter].labels(name, medium).inc(gained)
            self._last[counter, medium] = total
        for medium, tier in _tiers(tiers):
            if tier is not None:
                self._used.labels(name, medium).set(tier.used_bytes)
        seconds = tiers.stats.load_seconds
        for s in seconds[self._seen_loads :]:
            self._load.labels(name).observe(s)
        self._seen_loads = len(seconds)
        stats = tiers.stats
        if stats.load_wait_seconds > self._last_wait:
            self._wait.labels(name).inc(stats.load_wait_seconds - self._last_wait)
            self._last_wait = stats.load_wait_seconds
        if stats.swaps > self._last_swaps:
            self._swaps.labels(name).inc(stats.swaps - self._last_swaps)
            self._last_swaps = stats.swaps
