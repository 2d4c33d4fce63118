"""A trace as hit units for the offline references of ``offline_ceiling.py``.

The model is the *sequential* one of ``benchmarks/ceilings.py``: requests are served
one at a time in trace order, and between two requests the cache holds at most
``capacity`` pages. For a Mamba layout such as jamba-v0.1 (one full-attention group
and ``m`` Mamba groups, every group's block ``bs`` tokens, one page per block), a hit
of ``k`` blocks needs

- the KV block of each of the prompt's first ``k`` blocks (``kv_pages`` pages each:
  one per full-attention group), and
- the Mamba state after block ``k`` (``state_pages`` pages: one per Mamba group),

with ``k <= kmax = (input_length - 1) // bs`` (one token short of the prompt, as the
manager caps it). Block ``j``'s key (``ceilings.block_keys``) names its whole prefix,
so it names both the KV block ``j`` and the state after block ``j + 1`` of that prefix.

``Units`` flattens every request's blocks (``uid``: a dense id per distinct key;
``prev``: the last earlier request whose prompt holds the same key, -1 for none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ceilings import block_keys

from hybridkv.sim.trace import TraceRequest


@dataclass(frozen=True)
class Units:
    """Every request's prompt blocks, flattened in request order (module docstring).

    ``start[r]:start[r + 1]`` are request ``r``'s blocks, ``j = 0, 1, ...``;
    ``kmax[r]`` its longest hit in blocks; ``reach[r]`` the longest hit any cache
    could give it (``kmax`` capped by the leading blocks some earlier prompt holds)."""

    bs: int
    kv_pages: int
    state_pages: int
    prompt_tokens: int
    start: np.ndarray  # [R + 1] int64
    uid: np.ndarray  # [B] int64
    prev: np.ndarray  # [B] int64, -1: no earlier prompt holds it
    kmax: np.ndarray  # [R] int64
    reach: np.ndarray  # [R] int64

    @property
    def num_requests(self) -> int:
        return len(self.kmax)

    def blocks(self, r: int) -> slice:
        return slice(int(self.start[r]), int(self.start[r + 1]))

    def unlimited_hits(self) -> int:
        """Hit tokens with a cache that never evicts: every request hits its reach."""
        return int(self.reach.sum()) * self.bs


def build_units(
    requests: Sequence[TraceRequest], bs: int, kv_pages: int, state_pages: int
) -> Units:
    """The units of ``requests`` (Mooncake lines) at block size ``bs``."""
    ids: dict[int, int] = {}
    last: list[int] = []  # per uid: the last request holding it
    start = [0]
    uid: list[int] = []
    prev: list[int] = []
    kmax: list[int] = []
    reach: list[int] = []
    for r, req in enumerate(requests):
        keys = block_keys(req, bs)
        cap = min(len(keys), (req.input_length - 1) // bs)
        seen = 0
        for j, key in enumerate(keys):
            u = ids.setdefault(key, len(ids))
            if u == len(last):
                last.append(-1)
            p = last[u]
            if p >= 0 and seen == j:
                seen += 1
            uid.append(u)
            prev.append(p)
            last[u] = r
        start.append(len(uid))
        kmax.append(cap)
        reach.append(min(cap, seen))
    return Units(
        bs,
        kv_pages,
        state_pages,
        sum(r.input_length for r in requests),
        np.asarray(start, dtype=np.int64),
        np.asarray(uid, dtype=np.int64),
        np.asarray(prev, dtype=np.int64),
        np.asarray(kmax, dtype=np.int64),
        np.asarray(reach, dtype=np.int64),
    )
