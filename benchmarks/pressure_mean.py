"""Mean cached blocks by kind while the pool is under pressure.

A peak sampled while the pool still has never-used blocks measures memory
that costs nothing yet (states kept because nothing else wants the room).
``PressureMean`` averages only samples in which cached blocks fill at least
``FULL_SHARE`` of the pool, the same way for vLLM's manager and ours.
"""

from __future__ import annotations

#: A sample counts once cached blocks fill this share of the pool.
FULL_SHARE = 0.95


class PressureMean:
    """Running mean of per-kind cached blocks over the pressured samples."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.samples = 0
        self.sums: dict[str, int] = {}

    def add(self, counts: dict[str, int]) -> None:
        """One sample (cached blocks by kind); kept only under pressure."""
        if sum(counts.values()) < FULL_SHARE * self.capacity:
            return
        self.samples += 1
        for kind, n in counts.items():
            self.sums[kind] = self.sums.get(kind, 0) + n

    def mean(self) -> dict[str, float]:
        """Mean blocks by kind (empty: the pool never filled)."""
        return {k: v / self.samples for k, v in self.sums.items()} if self.samples else {}
