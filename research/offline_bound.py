"""An upper bound on any cache's hit tokens at ``capacity`` pages (Lagrangian dual).

The relaxation (every step makes the problem easier, so its optimum bounds the
sequential model's, ``offline_units``): a unit held from one prompt that holds it to
the next is an *interval*; a hit of ``k`` blocks at request ``r`` needs the intervals
ending at ``r`` of its first ``k`` KV blocks and of the state after block ``k``. Each
interval ends at exactly one request, so the hits are independent but for capacity:
at every gap between two requests, the intervals spanning it hold at most
``capacity`` pages. Relaxed: a state may be held from any earlier prompt holding its
prefix (really only a prompt that computed it there, not one that hit past it, has
it), nothing is charged for the running request's own blocks, and a unit may also be
dropped mid-interval for free (it then just serves no hit).

For prices ``lam[g] >= 0`` per page per gap (gap ``g`` lies before request ``g``),
weak duality gives, for every request's best bundle under those prices,

    OPT <= capacity * sum(lam) + sum_r max(0, max_k bs*k - cost_r(k))

where ``cost_r(k)`` is the pages of the bundle times the prices over the gaps each
interval spans. Every ``lam`` gives a valid bound; ``dual_bound`` searches for a small
one (a uniform price first, then projected subgradient steps per gap) and returns the
smallest seen, with each request's chosen depth at the last prices (a plan for
``offline_replay``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from offline_units import Units


@dataclass(frozen=True)
class Dual:
    """One evaluation: the bound, each request's best depth, the pages held per gap."""

    bound: float  # hit tokens
    depth: np.ndarray  # [R] blocks
    usage: np.ndarray  # [R] pages held across gap g (g = 0 unused)


class DualProblem:
    """The relaxation of the module docstring for one trace and capacity."""

    def __init__(self, units: Units, capacity: int) -> None:
        self.u = units
        self.capacity = capacity
        n_blocks = len(units.uid)
        counts = np.diff(units.start)
        self.req = np.repeat(np.arange(units.num_requests, dtype=np.int64), counts)
        self.pos = np.arange(n_blocks, dtype=np.int64) - np.repeat(units.start[:-1], counts)
        # A depth j + 1 is open when every KV block up to j was seen and the cap allows.
        self.open = self.pos < units.reach[self.req]
        self.prev = np.where(self.open, units.prev, 0)
        self.depth_tokens = (self.pos + 1) * units.bs
        self.seg = units.start[:-1]

    def evaluate(self, lam: np.ndarray) -> Dual:
        """The bound at prices ``lam`` ([R], ``lam[0]`` ignored)."""
        u = self.u
        big = np.cumsum(np.concatenate(([0.0], lam[1:])))  # big[r]: prices of gaps 1..r
        c = np.where(self.open, big[self.req] - big[self.prev], 0.0)
        cum = np.cumsum(c)
        before = np.concatenate(([0.0], cum))[self.seg][self.req]
        cost = u.kv_pages * (cum - before) + u.state_pages * c
        value = np.where(self.open, self.depth_tokens - cost, -np.inf)
        padded = np.concatenate((value, [-np.inf]))
        best = np.maximum.reduceat(padded, self.seg)
        best = np.where(np.diff(u.start) > 0, best, -np.inf)
        gain = np.maximum(best, 0.0)
        bound = self.capacity * float(lam[1:].sum()) + float(gain.sum())
        # The best depth: the deepest block whose value is its request's positive best.
        hit = (value == best[self.req]) & (value > 0)
        idx = np.where(hit, self.pos + 1, 0)
        depth = np.maximum.reduceat(np.concatenate((idx, [0])), self.seg)
        depth = np.where(np.diff(u.start) > 0, depth, 0)
        return Dual(bound, depth, self.usage(depth))

    def usage(self, depth: np.ndarray) -> np.ndarray:
        """Pages held across each gap when each request ``r`` hits ``depth[r]``."""
        u = self.u
        n = u.num_requests
        kv = self.pos < depth[self.req]
        diff = np.bincount(self.prev[kv] + 1, minlength=n + 2) * float(u.kv_pages)
        diff -= np.bincount(self.req[kv] + 1, minlength=n + 2) * float(u.kv_pages)
        chosen = np.flatnonzero(depth > 0)
        last = u.start[chosen] + depth[chosen] - 1
        diff += np.bincount(u.prev[last] + 1, minlength=n + 2) * float(u.state_pages)
        diff -= np.bincount(chosen + 1, minlength=n + 2) * float(u.state_pages)
        return np.cumsum(diff)[:n]


def uniform_price(problem: DualProblem, steps: int = 40) -> tuple[float, Dual]:
    """The best single price for every gap (golden-section search on a log scale)."""
    n = problem.u.num_requests

    def at(x: float) -> Dual:
        return problem.evaluate(np.full(n, math.exp(x)))

    lo, hi = math.log(1e-7), math.log(float(problem.u.bs))
    phi = (math.sqrt(5) - 1) / 2
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = at(a), at(b)
    for _ in range(steps):
        if fa.bound <= fb.bound:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = at(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = at(b)
    best_x, best = (a, fa) if fa.bound <= fb.bound else (b, fb)
    return math.exp(best_x), best


def dual_bound(
    problem: DualProblem, iterations: int = 200, step: float = 0.5
) -> tuple[Dual, Dual, list[float]]:
    """(uniform-price dual, the smallest bound found, the bound at each iteration).

    Projected subgradient from the best uniform price: ``lam += eta * (usage -
    capacity) / capacity * lam0``, ``eta = step / sqrt(t + 1)``. The second value's
    ``bound`` is the smallest of all evaluations (each is a valid bound); its
    ``depth`` is the plan at those prices."""
    n = problem.u.num_requests
    lam0, uni = uniform_price(problem)
    lam = np.full(n, lam0)
    best, cur = uni, uni
    trail = [uni.bound]
    for t in range(iterations):
        grad = (cur.usage - problem.capacity) / problem.capacity
        grad[0] = 0.0
        lam = np.maximum(0.0, lam + step / math.sqrt(t + 1) * lam0 * grad)
        cur = problem.evaluate(lam)
        trail.append(cur.bound)
        if cur.bound < best.bound:
            best = cur
    return uni, best, trail
