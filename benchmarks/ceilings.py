"""Hit-rate ceilings on a Mooncake trace: what an eviction rule could reach with
``cap`` full-attention blocks (the pages of a memory budget, all spent on the
full-attention group).

Requests are replayed one at a time as chains of block keys; a hit is the
leading cached blocks, capped one token short of the prompt (as the manager
does). Two rules:

- ``lru_hits``: least recently used, a request's blocks released deepest first
  (the free queue's order);
- ``belady_hits``: offline optimal for the paging problem: evict the block whose
  next use is furthest away (never used again first; a deeper block first on
  ties, so the cache stays prefix-closed).

``bench_vllm_cache.py`` prints both beside each layout's hit rates;
``research/bench_ceiling.py`` tabulates them per layout and budget.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, defaultdict, deque
from collections.abc import Sequence

from hybridkv.sim.trace import HASH_BLOCK_TOKENS, TraceRequest

INF = 1 << 62


def block_keys(req: TraceRequest, block_size: int) -> list[int]:
    """Chained keys of the prompt's full blocks (equal keys <=> equal prefixes)."""
    assert req.hash_ids is not None, "Mooncake requests only"
    keys: list[int] = []
    parent = 0
    for k in range(req.input_length // block_size):
        first, last = k * block_size, (k + 1) * block_size - 1
        h0 = req.hash_ids[first // HASH_BLOCK_TOKENS]
        h1 = req.hash_ids[last // HASH_BLOCK_TOKENS]
        parent = hash((parent, h0, h1, first % HASH_BLOCK_TOKENS))
        keys.append(parent)
    return keys


def hit_blocks(keys: Sequence[int], input_length: int, block_size: int, cached: object) -> int:
    """Leading cached blocks, at most ``(input_length - 1) // block_size``."""
    limit = min(len(keys), (input_length - 1) // block_size)
    n = 0
    while n < limit and keys[n] in cached:  # type: ignore[operator]
        n += 1
    return n


def lru_hits(requests: Sequence[list[int]], lengths: Sequence[int], bs: int, cap: int) -> int:
    """Hit tokens under LRU with ``cap`` blocks (the module docstring's rule)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for keys, length in zip(requests, lengths, strict=True):
        hits += hit_blocks(keys, length, bs, cache) * bs
        for key in reversed(keys):  # deepest released first = evicted first
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > cap:
            cache.popitem(last=False)
    return hits


def belady_hits(requests: Sequence[list[int]], lengths: Sequence[int], bs: int, cap: int) -> int:
    """Hit tokens under offline-optimal eviction with ``cap`` blocks."""
    uses: defaultdict[int, deque[int]] = defaultdict(deque)
    for i, keys in enumerate(requests):
        for key in keys:
            uses[key].append(i)
    cached: dict[int, int] = {}  # key -> next use
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, key), lazy
    hits = 0
    for keys, length in zip(requests, lengths, strict=True):
        hits += hit_blocks(keys, length, bs, cached) * bs
        for depth, key in enumerate(keys):
            q = uses[key]
            q.popleft()
            nxt = q[0] if q else INF
            cached[key] = nxt
            heapq.heappush(heap, (-nxt, -depth, key))
        while len(cached) > cap:
            neg, _, key = heapq.heappop(heap)
            if cached.get(key) == -neg:
                del cached[key]
    return hits
