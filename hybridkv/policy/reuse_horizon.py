"""``ReuseHorizon`` and ``ReleaseTimes``: how long after its release a prefix still returns.

The cost-aware free set (``hybridkv.policy.cost_aware``) keeps a valuable
unit ``weight`` pool turnovers longer per doubling of its value. That bet is
right while the unit may still be hit, and wrong for units nobody comes back
to (a chat client that left: ``benchmarks/multiturn.py``). This learner
measures the bet's horizon instead of fixing it. ``ReleaseTimes`` gives each
new prompt's *gap*: the free set's releases since its deepest prefix sample
was last released, whether the cache still holds it or not. ``ReuseHorizon``
keeps the largest of the last ``window`` gaps, and the horizon is ``margin``
times that (a window's largest gap falls short of the longest to come): a free
block released longer ago has outlived every return the window saw, so the
free set drops its value bonus and ranks it by recency alone
(``CostAwareEvictionPolicy``).

Until ``min_observed`` gaps are seen there is no horizon (every bonus holds).
The window's maximum is kept with a monotone deque: O(1) amortized per gap.
Measured by ``HybridPolicy.admit``; switch ``HybridTuning.learn_reuse_horizon``.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

from hybridkv.policy.returning import sample_keys


class ReuseHorizon:
    """Sliding maximum of the last ``window`` reuse gaps (module docstring)."""

    __slots__ = ("_ages", "count", "margin", "min_observed", "window")

    def __init__(self, window: int, min_observed: int, margin: float = 1.0) -> None:
        """``window``: gaps remembered (the most recent); ``min_observed``: gaps
        needed before a horizon is given; ``margin``: horizon / largest gap."""
        if window < 1 or min_observed < 1:
            raise ValueError(
                f"window and min_observed must be >= 1, got {window!r}, {min_observed!r}"
            )
        if not margin >= 1:
            raise ValueError(f"margin must be >= 1, got {margin!r}")
        self.margin = margin
        self.window = window
        self.min_observed = min_observed
        self.count = 0
        #: (index, gap) of the window, gaps strictly decreasing from the left.
        self._ages: deque[tuple[int, float]] = deque()

    def observe(self, age: float) -> None:
        """Note one gap: a prefix returned ``age`` keyed releases after its release."""
        ages = self._ages
        while ages and ages[-1][1] <= age:
            ages.pop()
        ages.append((self.count, age))
        self.count += 1
        oldest = self.count - self.window
        while ages[0][0] < oldest:
            ages.popleft()

    @property
    def horizon(self) -> float | None:
        """``margin`` x the largest gap among the last ``window``; None before
        ``min_observed`` gaps."""
        if self.count < self.min_observed:
            return None
        return self.margin * self._ages[0][1]

    def check_integrity(self) -> None:
        ages = [a for _, a in self._ages]
        assert all(x > y for x, y in itertools.pairwise(ages)), "ages not decreasing"
        assert not self._ages or self._ages[0][0] >= self.count - self.window, "stale maximum"


class ReleaseTimes:
    """When each prefix sample was last released, for the reuse gaps.

    The ``hybrid`` policy records a freed request's full-attention block
    hashes, one in ``stride`` (as ``SeenPrefixes`` samples them), with the
    free set's ``clock``; a new prompt's *gap* is the clock now minus the
    time of its deepest recorded sample. Unlike the ages of free blocks hit,
    gaps are not censored by the eviction they steer: a prefix evicted
    early still shows its gap when it returns. Bounded as ``SeenPrefixes``
    is: two generations of at most ``capacity / 2`` samples each.
    """

    __slots__ = ("_half", "_new", "_old", "stride")

    def __init__(self, capacity: int, stride: int) -> None:
        if capacity < 0 or stride < 1:
            raise ValueError(f"capacity must be >= 0, stride >= 1, got {capacity!r}, {stride!r}")
        self.stride = stride
        self._half = capacity // 2
        self._new: dict[int, int] = {}
        self._old: dict[int, int] = {}

    def record(self, hashes: Sequence[bytes], num_blocks: int, now: int) -> None:
        """The first ``num_blocks`` of ``hashes`` (chained) were released at ``now``."""
        self.record_samples(sample_keys(hashes, num_blocks, self.stride), now)

    def record_samples(self, samples: list[int], now: int) -> None:
        """``record`` of the samples ``sample_keys`` took (this ``stride``)."""
        new = self._new
        new.update(dict.fromkeys(samples, now))
        if len(new) > self._half:
            self._old = new if self._half else {}
            self._new = {}

    def gap(self, hashes: Sequence[bytes], now: int) -> int | None:
        """``now`` minus the release time of the deepest recorded sample of
        ``hashes``; None when none was recorded."""
        new, old = self._new, self._old
        stride = self.stride
        for i in range(len(hashes) // stride * stride - 1, -1, -stride):
            key = hash(hashes[i])
            t = new.get(key)
            if t is None:
                t = old.get(key)
            if t is not None:
                return now - t
        return None

    def check_integrity(self) -> None:
        assert len(self._new) <= self._half, f"{len(self._new)} samples, at most {self._half}"
