"""Prefix-cache statistics: queries and hits, per request and in tokens."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters since the last ``make_prefix_cache_stats()``.

    ``queries`` / ``hits`` count tokens of first-time lookups; lookups of
    preempted requests (recomputation) are counted apart, in ``preempted_*``.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one lookup of ``num_tokens`` tokens that hit ``num_hits``."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        """Hit tokens over queried tokens (0.0 with no queries)."""
        return self.hits / self.queries if self.queries else 0.0
