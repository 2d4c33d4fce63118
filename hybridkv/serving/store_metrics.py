"""``StoreMetrics``: the shared store's own series on ``GET /metrics`` (``--kv-store``).

Its hits, hit tokens and loads are ``kv_tier_*{medium="STORE"}`` (``tier_metrics.py``);
these say what went over the network (label ``model_name``):

- counters ``kv_store_puts`` (objects written that landed), ``kv_store_gets``
  (objects asked for), ``kv_store_lookups`` (lookups of a waiting request's units),
  ``kv_store_bytes`` (label ``direction``: ``put`` / ``get``), and
  ``kv_store_failures`` (label ``kind``: ``put`` (a write the store refused with an
  error), ``no_room`` (a write skipped: the store or the write queue full),
  ``get`` (a read that found nothing or a bad entry: recomputed), ``unreachable``
  (calls answered at once while the master was gone), ``device_full`` (tier hits not
  restored: the device pool had no room for their blocks), ``late`` (a finished
  request's last chunk sent with its store writes still in flight, after the
  URL's ``finish`` seconds)), ``kv_store_held`` (finished requests' last
  chunks held until their store writes ended, ``serving.held_finishes``),
  ``kv_store_held_seconds`` (their time held) and ``kv_store_evictions_seen``
  (objects this replica wrote that it found the store had evicted:
  ``tiers/store_watch.py``);
- gauge ``kv_store_up`` (1 while the master answers);
- histograms ``kv_store_put_seconds`` / ``kv_store_get_seconds`` (per batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridkv.offload import TieredCache
    from hybridkv.tiers import MooncakeTier

P = "hybridkv:"
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


#: Every ``(counter, label value)`` pair (``""``: no label but ``model_name``).
_SERIES = (
    ("kv_store_puts", ""),
    ("kv_store_gets", ""),
    ("kv_store_lookups", ""),
    ("kv_store_evictions_seen", ""),
    ("kv_store_bytes", "put"),
    ("kv_store_bytes", "get"),
    ("kv_store_failures", "put"),
    ("kv_store_failures", "no_room"),
    ("kv_store_failures", "get"),
    ("kv_store_failures", "unreachable"),
    ("kv_store_failures", "device_full"),
    ("kv_store_failures", "late"),
    ("kv_store_held", ""),
    ("kv_store_held_seconds", ""),
)


def _totals(tiers: TieredCache, store: MooncakeTier) -> dict[tuple[str, str], float]:
    """Every counter's current total, by ``(name, label value)``."""
    t, s = store.stats, store.store_stats
    lookups = tiers.loads.lookup.asked if tiers.loads.lookup is not None else 0
    return {
        ("kv_store_puts", ""): t.stores,
        ("kv_store_gets", ""): t.loads + t.load_failures,
        ("kv_store_lookups", ""): lookups,
        ("kv_store_evictions_seen", ""): s.found_gone,
        ("kv_store_bytes", "put"): s.put_bytes,
        ("kv_store_bytes", "get"): s.get_bytes,
        ("kv_store_failures", "put"): t.store_failures,
        ("kv_store_failures", "no_room"): t.store_skips,
        ("kv_store_failures", "get"): t.load_failures,
        ("kv_store_failures", "unreachable"): s.unreachable,
        ("kv_store_failures", "device_full"): tiers.stats.skipped_no_room,
        ("kv_store_failures", "late"): tiers.stats.store_late,
        ("kv_store_held", ""): tiers.stats.store_waits,
        ("kv_store_held_seconds", ""): tiers.stats.store_wait_seconds,
    }


class StoreMetrics:
    """The store series of one server's registry (module docstring)."""

    def __init__(self, registry: Any, model_name: str) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self._name = model_name
        labels = {"kv_store_bytes": "direction", "kv_store_failures": "kind"}
        docs = {
            "kv_store_puts": "Objects written to the shared store that landed.",
            "kv_store_gets": "Objects asked of the shared store.",
            "kv_store_lookups": "Lookups of a waiting request's units in the store.",
            "kv_store_evictions_seen": "Objects this replica wrote, found evicted since.",
            "kv_store_bytes": "Bytes sent to and read from the shared store.",
            "kv_store_failures": "Store writes and reads that did not happen or failed.",
            "kv_store_held": "Finished requests' last chunks held for their store writes.",
            "kv_store_held_seconds": "The time those last chunks were held.",
        }
        self._counters = {
            n: Counter(
                P + n, doc, ["model_name", *([labels[n]] if n in labels else [])], registry=registry
            )
            for n, doc in docs.items()
        }
        self._up = Gauge(
            P + "kv_store_up",
            "1 while the store's master answers.",
            ["model_name"],
            registry=registry,
        )
        self._seconds = {
            d: Histogram(
                P + f"kv_store_{d}_seconds",
                f"Per {d} batch: its time.",
                ["model_name"],
                buckets=_BUCKETS,
                registry=registry,
            )
            for d in ("put", "get")
        }
        for counter, label in _SERIES:  # every series from the start, at 0
            series = self._counters[counter]
            series.labels(model_name, label) if label else series.labels(model_name)
        self._up.labels(model_name)
        self._last: dict[tuple[str, str], float] = {}
        self._seen = {"put": 0, "get": 0}

    def refresh(self, tiers: TieredCache) -> None:
        """Add what the store counted since the last call; set the gauge."""
        store = tiers.store
        if store is None:
            return
        name = self._name
        for (counter, label), total in _totals(tiers, store).items():
            gained = total - self._last.get((counter, label), 0)
            if gained:
                series = self._counters[counter]
                (series.labels(name, label) if label else series.labels(name)).inc(gained)
            self._last[counter, label] = total
        self._up.labels(name).set(1 if store.client.healthy() else 0)
        s = store.store_stats
        for d, seconds in (("put", s.put_seconds), ("get", s.get_seconds)):
            for x in seconds[self._seen[d] :]:
                self._seconds[d].labels(name).observe(x)
            self._seen[d] = len(seconds)
