"""Cache replays in the sequential model of ``offline_units``: what a policy reaches.

Each replay is a real cache: at most ``capacity`` pages between two requests, a hit of
``k`` blocks only when the KV blocks ``0..k-1`` and the state after block ``k`` are
held, and a state held only where some request computed it (a request that hits ``h``
blocks computes the states after blocks ``h + 1 ..``; it also still holds the state
it hit). Their hit tokens are achievable, not bounds.

- ``lru_replay``: least recently used over KV blocks and every block boundary's
  state (``lru``'s snapshots), a request's units released deepest first;
- ``planned_replay``: offline, from a plan ``depth[r]`` (each request's intended hit):
  a unit is *needed* at ``r`` when ``r``'s planned hit reads it. Units never needed
  again are dropped; otherwise the unit evicted is the one whose next need is
  farthest, in pages times requests when ``per_byte`` (Belady for variable sizes),
  in requests alone otherwise, a deeper block first on ties. With ``depth =
  units.reach`` this is Belady with every reachable hit planned; with the dual's
  depths (``offline_bound``) it skips the hits that the prices say cost more pages
  than they return.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

import numpy as np
from offline_units import Units

NEVER = 1 << 62


class _Needs:
    """For each unit id, the requests that need it, ascending (CSR), and a cursor."""

    def __init__(self, uid: np.ndarray, req: np.ndarray, num_ids: int) -> None:
        order = np.argsort(uid, kind="stable")
        self.req = [*req[order].tolist(), NEVER]
        counts = np.bincount(uid, minlength=num_ids)
        self.at = np.concatenate(([0], np.cumsum(counts))).tolist()
        self.end = self.at[1:]

    def after(self, u: int, r: int) -> int:
        """The first request after ``r`` that needs ``u`` (``NEVER``: none)."""
        i, end = self.at[u], self.end[u]
        while i < end and self.req[i] <= r:
            i += 1
        self.at[u] = i
        return self.req[i] if i < end else NEVER


def _hit(units: Units, uids: list[int], kmax: int, kv: object, st: object) -> int:
    """Blocks hit: the deepest ``k <= kmax`` with KV ``0..k-1`` and state ``k`` held."""
    h = 0
    for j in range(kmax):
        u = uids[j]
        if u not in kv:  # type: ignore[operator]
            break
        if u in st:  # type: ignore[operator]
            h = j + 1
    return h


def lru_replay(units: Units, capacity: int) -> int:
    """Hit tokens of LRU over KV blocks and every boundary's state (module docstring)."""
    kvp, sp = units.kv_pages, units.state_pages
    cache: OrderedDict[tuple[int, int], int] = OrderedDict()  # (kind, uid) -> pages
    kv: set[int] = set()
    st: set[int] = set()
    used = hits = 0
    uid = units.uid.tolist()
    start = units.start.tolist()
    kmax = units.kmax.tolist()
    for r in range(units.num_requests):
        uids = uid[start[r] : start[r + 1]]
        h = _hit(units, uids, kmax[r], kv, st)
        hits += h * units.bs
        for j in range(len(uids) - 1, -1, -1):  # deepest first: evicted first
            u = uids[j]
            if j >= h - 1:  # the state after block j + 1: computed, or the one hit
                if (1, u) not in cache:
                    st.add(u)
                    used += sp
                cache[(1, u)] = sp
                cache.move_to_end((1, u))
            if (0, u) not in cache:
                kv.add(u)
                used += kvp
            cache[(0, u)] = kvp
            cache.move_to_end((0, u))
        while used > capacity:
            (kind, u), pages = cache.popitem(last=False)
            (st if kind else kv).remove(u)
            used -= pages
    return hits


def planned_replay(units: Units, capacity: int, depth: np.ndarray, per_byte: bool) -> int:
    """Hit tokens of the offline replay for plan ``depth`` (module docstring)."""
    n_ids = int(units.uid.max()) + 1 if len(units.uid) else 0
    counts = np.diff(units.start)
    req = np.repeat(np.arange(units.num_requests, dtype=np.int64), counts)
    pos = np.arange(len(units.uid), dtype=np.int64) - np.repeat(units.start[:-1], counts)
    kv_need = pos < depth[req]
    kv_needs = _Needs(units.uid[kv_need], req[kv_need], n_ids)
    chosen = np.flatnonzero(depth > 0)
    last = units.start[chosen] + depth[chosen] - 1
    st_needs = _Needs(units.uid[last], chosen, n_ids)

    size = (units.kv_pages, units.state_pages)
    held: tuple[dict[int, int], dict[int, int]] = ({}, {})  # uid -> next need
    heaps: tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]] = ([], [])
    used = hits = 0
    uid = units.uid.tolist()
    start = units.start.tolist()
    kmax = units.kmax.tolist()
    needs = (kv_needs, st_needs)
    for r in range(units.num_requests):
        uids = uid[start[r] : start[r + 1]]
        h = _hit(units, uids, kmax[r], held[0], held[1])
        hits += h * units.bs
        for j, u in enumerate(uids):
            for kind in (0, 1):
                if kind and j < h - 1:
                    continue  # a state this request neither computed nor hit
                nxt = needs[kind].after(u, r)
                have = held[kind]
                if nxt == NEVER:
                    if u in have:
                        del have[u]
                        used -= size[kind]
                    continue
                if u not in have:
                    used += size[kind]
                have[u] = nxt
                heapq.heappush(heaps[kind], (-nxt, -j, u))
        while used > capacity:
            tops = []
            for kind in (0, 1):
                heap, have = heaps[kind], held[kind]
                while heap and have.get(heap[0][2]) != -heap[0][0]:
                    heapq.heappop(heap)
                if heap:
                    far = -heap[0][0] - r
                    tops.append((far * size[kind] if per_byte else far, -heap[0][1], kind))
            _, _, kind = max(tops)
            _, _, u = heapq.heappop(heaps[kind])
            del held[kind][u]
            used -= size[kind]
    return hits
