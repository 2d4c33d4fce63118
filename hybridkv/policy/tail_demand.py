"""Tail demand: which of a freed request's aligned tail points later requests branch at.

With an aligned tail (``tail_alignment``), a freed request can keep three
kinds of tail point, each at the cost of a window, a chunk or a Mamba state
per group:

- ``AT_END``: its *aligned end*, the highest grid point of its tail, where a
  request that extends it (the next turn of a conversation) resumes;
- ``BELOW``: the grid points of its tail below that (a request that shares
  all but its last grid unit: an edited last message);
- ``OFF_GRID_END``: its end ``E`` itself, when ``E`` is not on the grid, or
  its grid multiple lies past the request's tokens (a request that repeats it
  up to its end).

Whether later requests branch at the last two is traffic's business (on the
Mooncake conversation trace they rarely do: ``docs/hybrid-caching.md``), yet
each such point holds a window or a state of its own.
``TailDemand`` learns it: every freed request *marks* the full-attention
block ending at each of its tail points with the point's kind (a bounded
memory of recent marks: metadata, no KV); every admitted request looks up the
block at its branch point. Over the last ``learn_window`` admissions (``HybridTuning``), a kind's
*weight* is how often requests branched at it relative to aligned ends,
``(count + 1) / (aligned-end count + 1)``, at most 1 (and 1 until
``learn_min_observed`` admissions were seen). Cost-aware eviction multiplies the
value of what only such a point needs by its weight
(``retention.UnitValues``): rarely used points go first when memory is short,
and stay while it is not.

A block that is the aligned end of one request and a lower point of another
counts as ``AT_END``: the aligned end of the first serves a branch there.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning

#: Branch point kinds (``UNMARKED``: no freed request's tail point).
UNMARKED, AT_END, BELOW, OFF_GRID_END = 0, 1, 2, 3


class TailDemand:
    """Learns which tail point kinds later requests branch at (module docstring)."""

    __slots__ = (
        "_counts",
        "_learn",
        "_marks",
        "_seen",
        "below_weight",
        "end_weight",
        "max_marks",
        "min_observed",
        "window",
    )

    def __init__(self, tuning: HybridTuning = DEFAULT_TUNING) -> None:
        self.window = tuning.learn_window
        self.min_observed = tuning.learn_min_observed
        self.max_marks = tuning.max_marks
        #: False: the weights stay 1 (``learn_tail_demand`` off).
        self._learn = tuning.learn_tail_demand
        self._marks: OrderedDict[bytes, int] = OrderedDict()
        self._seen: deque[int] = deque()
        self._counts = [0, 0, 0, 0]
        #: Weight of the aligned tail's grid points below its aligned end.
        self.below_weight = 1.0
        #: Weight of an off-grid end ``E``.
        self.end_weight = 1.0

    def mark(self, key: bytes, kind: int) -> None:
        """The full-attention block with hash ``key`` ends a freed request's
        tail point of ``kind`` (``AT_END`` wins over the others)."""
        marks = self._marks
        old = marks.pop(key, None)
        marks[key] = kind if old is None else min(old, kind)
        if len(marks) > self.max_marks:
            marks.popitem(last=False)

    def observe(self, key: bytes) -> None:
        """An admitted request branched after the block with hash ``key``."""
        if not self._learn:
            return
        kind = self._marks.get(key, UNMARKED)
        seen, counts = self._seen, self._counts
        seen.append(kind)
        counts[kind] += 1
        if len(seen) > self.window:
            counts[seen.popleft()] -= 1
        if len(seen) >= self.min_observed:
            self.below_weight, self.end_weight = self._weights()

    def _weights(self) -> tuple[float, float]:
        c = self._counts
        base = c[AT_END] + 1
        return min(1.0, (c[BELOW] + 1) / base), min(1.0, (c[OFF_GRID_END] + 1) / base)

    def reset(self) -> None:
        """Forget the observations (the grid changed: marks of the old one
        mean something else); both weights are 1 until relearned."""
        self._marks.clear()
        self._seen.clear()
        self._counts = [0, 0, 0, 0]
        self.below_weight = self.end_weight = 1.0

    def check_integrity(self) -> None:
        """Counts match the remembered observations; weights match the counts."""
        assert len(self._seen) <= self.window and len(self._marks) <= self.max_marks
        assert self._counts == [sum(k == i for k in self._seen) for i in range(4)], "counts off"
        assert all(k in (AT_END, BELOW, OFF_GRID_END) for k in self._marks.values())
        if len(self._seen) >= self.min_observed:
            assert (self.below_weight, self.end_weight) == self._weights(), "stale weights"
        else:
            assert self.below_weight == self.end_weight == 1.0, "weighed before learn_min_observed"
