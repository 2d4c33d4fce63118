"""Returning prompts: requests that continue a prompt the cache has seen.

On conversation traffic, whether a request's prefix will be reused is mostly
whether its conversation goes on, and a conversation that has gone on once
is likely to go on again. On the Mooncake conversation trace 31 % of first
turns are continued, 77 % of eighth turns (``bench_reuse_predictors.py``'s
``Conversations``). A first turn and a later
one look alike to recency, so a recency-ranked cache keeps both equally long
and, when memory is short, loses both.

``SeenPrefixes`` tells them apart online. It remembers the hashes of the
blocks the cache has held, evicted or not (a bounded LRU set of hashes:
metadata, no KV; ``capacity`` entries). A new request is *returning* when at
least ``share`` of its prompt's blocks, counted from its start, were seen
before: it continues an earlier prompt rather than sharing only a common
header (a system prompt) with it. Cost-aware eviction then values a returning
request's units ``bonus`` pool turnovers longer: their values are multiplied
by ``2 ** (bonus / weight)`` (``KVCacheCoordinator.return_factor``). The whole trace, all-full-attention replay of
``benchmarks/bench_reuse_predictors.py`` (Jamba's pages): recency 10.77 % at
40 GB, with returning requests kept 4 turnovers longer 16.54 %; 20.84 % and
21.54 % at 80 GB. ``hybrid`` itself, Jamba: 10.44 % -> 15.87 % and
19.64 % -> 20.76 % (``results/cache.md``).

A request resumed after preemption keeps the answer of its first admission
(``Request.returning``): its own earlier blocks are no evidence.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

#: Share of a prompt's blocks, from its start, seen before for it to be returning.
RETURNING_SHARE = 0.5
#: Pool turnovers a returning request's units are kept longer (``hybrid_return_bonus``).
RETURN_BONUS = 4.0
#: Hashes remembered per block of the pool.
SEEN_PER_BLOCK = 8


class SeenPrefixes:
    """A bounded memory of the block hashes the cache has held (module docstring).

    ``record`` moves hashes to the most recent end (the oldest are forgotten
    beyond ``capacity``); ``returning`` asks whether a prompt continues them.
    Hashes are stored as Python ``hash`` values (ints): the block hashes
    themselves need not outlive their blocks.
    """

    __slots__ = ("_seen", "capacity", "share")

    def __init__(self, capacity: int, share: float = RETURNING_SHARE) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self.capacity = capacity
        self.share = share
        self._seen: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def returning(self, hashes: Sequence[bytes], block_size: int, num_tokens: int) -> bool:
        """Whether the blocks covering ``share`` of a prompt's ``num_tokens``,
        from its start, were all seen (``hashes``: its whole blocks of
        ``block_size`` tokens). A prompt needing more blocks than it has
        whole ones (a short prompt) is not returning."""
        need = max(1, math.ceil(self.share * num_tokens / block_size))
        if need > len(hashes):
            return False
        seen = self._seen
        return all(hash(h) in seen for h in hashes[:need])

    def record(self, hashes: Sequence[bytes]) -> None:
        """Remember ``hashes`` as the most recently held; forget the oldest beyond capacity."""
        seen = self._seen
        move = seen.move_to_end
        for h in hashes:
            k = hash(h)
            if k in seen:
                move(k)
            else:
                seen[k] = None
        while len(seen) > self.capacity:
            seen.popitem(last=False)

    def check_integrity(self) -> None:
        assert len(self._seen) <= self.capacity, (
            f"{len(self._seen)} hashes remembered, capacity {self.capacity}"
        )
