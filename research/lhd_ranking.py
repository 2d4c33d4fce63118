"""Least hit density (LHD) for the all-full-attention ceiling replay (issue 15).

LHD (Beckmann, Chen and Cidon, NSDI 2018) ranks what a cache holds by its
*hit density*: the hits a cached object is still expected to get, per unit of
space and time it will still occupy, given its class and its age (time since
its last use). Both come from what the cache saw so far, so the ranking is
online. Here, as in ``bench_reuse_predictors.py``:

- an object is a request's *unit*: the blocks it inserted or hit last
  (a later request that hits or re-inserts a block takes it over);
- its class is whatever the caller says (the conversation's turn, say), its
  age is counted in requests since the unit's request;
- every block a later request hits records a hit at the owning unit's (class,
  age bin); every block evicted records an eviction there;
- per class, from the top age bin down: ``density(b) = hits at ages >= b /
  sum over ages >= b of the events still to come there x the bin's width``,
  rebuilt every ``recompute`` requests, after which the counts decay by
  ``decay`` (older traffic counts less);
- when the pool is over ``cap`` blocks, units are evicted lowest density
  first, each from its deepest block (a prefix keeps its head longest), the
  new request's own blocks last. Where a class has no evidence at an age yet,
  the density is ``1 / (age + 1)``: recency.

The bench replays the same requests as the other rankings and reports the hit
tokens. ``research/tests/test_lhd_ranking.py`` pins the density and the eviction order.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from bench_ceiling import evict_units
from ceilings import hit_blocks

#: Age bins: 4 per octave of age in requests, the last open-ended.
BINS_PER_OCTAVE = 4
NUM_BINS = 64


def age_bin(age: int) -> int:
    """The bin of an age in requests (>= 0): ``floor(4 log2(age + 1))``, capped."""
    return min(int(BINS_PER_OCTAVE * math.log2(age + 1)), NUM_BINS - 1)


def bin_width(b: int) -> float:
    """How many requests of age bin ``b`` covers (its share of the age axis)."""
    return float(2 ** ((b + 1) / BINS_PER_OCTAVE) - 2 ** (b / BINS_PER_OCTAVE))


class HitDensity:
    """Hit and eviction counts per (class, age bin), and the densities they give."""

    def __init__(self) -> None:
        self.hits: dict[Hashable, list[float]] = {}
        self.evictions: dict[Hashable, list[float]] = {}
        self._density: dict[Hashable, list[float | None]] = {}

    def _row(self, table: dict[Hashable, list[float]], c: Hashable) -> list[float]:
        row = table.get(c)
        if row is None:
            row = table[c] = [0.0] * NUM_BINS
        return row

    def hit(self, c: Hashable, age: int, blocks: int = 1) -> None:
        self._row(self.hits, c)[age_bin(age)] += blocks

    def evict(self, c: Hashable, age: int, blocks: int) -> None:
        self._row(self.evictions, c)[age_bin(age)] += blocks

    def rebuild(self, decay: float = 1.0) -> None:
        """Densities from the counts so far; then every count is multiplied by ``decay``."""
        for c in set(self.hits) | set(self.evictions):
            h, e = self._row(self.hits, c), self._row(self.evictions, c)
            row: list[float | None] = [None] * NUM_BINS
            hits_above = events_above = lifetime = 0.0
            for b in range(NUM_BINS - 1, -1, -1):
                hits_above += h[b]
                events_above += h[b] + e[b]
                lifetime += events_above * bin_width(b)
                row[b] = hits_above / lifetime if lifetime > 0 else None
            self._density[c] = row
            for b in range(NUM_BINS):
                h[b] *= decay
                e[b] *= decay

    def density(self, c: Hashable, age: int) -> float:
        """The last rebuilt density of class ``c`` at ``age``; ``1 / (age + 1)``
        where there is none yet."""
        row = self._density.get(c)
        d = None if row is None else row[age_bin(age)]
        return 1.0 / (age + 1) if d is None else d


def lhd_hits(
    keys: Sequence[list[int]],
    lengths: Sequence[int],
    bs: int,
    cap: int,
    classes: Sequence[Hashable],
    recompute: int = 200,
    decay: float = 0.99,
    model: HitDensity | None = None,
) -> int:
    """Hit tokens of the requests (chained block ``keys``, prompt ``lengths``)
    under LHD with ``cap`` blocks (module docstring); ``classes[i]``: request
    ``i``'s class. ``model``: the density model to learn into (a new one if None)."""
    model = HitDensity() if model is None else model
    owner: dict[int, int] = {}  # block key -> the request whose unit holds it
    units: dict[int, list[int]] = {}  # request -> its blocks, shallowest first (some stale)
    hits = 0
    for i, (ks, length) in enumerate(zip(keys, lengths, strict=True)):
        m = hit_blocks(ks, length, bs, owner)
        hits += m * bs
        for k in ks[:m]:
            u = owner[k]
            model.hit(classes[u], i - u)
        for k in ks:
            owner[k] = i
        units[i] = list(ks)
        if i % recompute == 0:
            model.rebuild(decay)
        if len(owner) <= cap:
            continue
        order = sorted((model.density(classes[u], i - u), u) for u in units if u != i)
        for u, count in evict_units(owner, units, (u for _, u in order), i, cap):
            model.evict(classes[u], i - u, count)
    return hits
