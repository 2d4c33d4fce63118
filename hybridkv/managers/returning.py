"""Returning prompts: requests that continue a prompt the cache has seen.

On conversation traffic, whether a request's prefix will be reused is mostly
whether its conversation goes on, and a conversation that has gone on once
is likely to go on again. On the Mooncake conversation trace 31 % of first
turns are continued, 77 % of eighth turns (``bench_reuse_predictors.py``'s
``Conversations``). A first turn and a later one look alike to recency, so a
recency-ranked cache keeps both equally long and, when memory is short, loses
both.

``SeenPrefixes`` tells them apart online. It remembers the hashes of the
blocks the cache has held, evicted or not (the most recent ``capacity / 2``
to ``capacity`` of them, in two generations: metadata, no KV). A new request
is *returning* when at least ``share`` of its prompt's blocks, counted from
its start, were seen before: it continues an earlier prompt rather than sharing only a common
header (a system prompt) with it. Cost-aware eviction then values a returning
request's units ``bonus`` pool turnovers longer: their values are multiplied
by ``2 ** (bonus / weight)`` (``KVCacheCoordinator.return_factor``). The
whole trace, all-full-attention replay of
``benchmarks/bench_reuse_predictors.py`` (Jamba's pages): recency 10.77 % at
40 GB, with returning requests kept 4 turnovers longer 16.18 %; 20.84 % and
21.50 % at 80 GB. ``hybrid`` itself, Jamba: 10.44 % -> 15.87 % and
19.64 % -> 20.77 % (``results/cache.md``).

A request resumed after preemption keeps the answer of its first admission
(``Request.returning``): its own earlier blocks are no evidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Share of a prompt's blocks, from its start, seen before for it to be returning.
RETURNING_SHARE = 0.5
#: Pool turnovers a returning request's units are kept longer (``hybrid_return_bonus``).
RETURN_BONUS = 4.0
#: Hashes remembered per block of the pool.
SEEN_PER_BLOCK = 8


class SeenPrefixes:
    """A bounded memory of the block hashes the cache has held (module docstring).

    Two generations of hashes: ``record`` adds to the newer one, and once it
    holds half of ``capacity`` it becomes the older one, the former older one
    being forgotten. So the most recent ``capacity / 2`` to ``capacity``
    hashes (plus one request's at most) are remembered, a hash recorded again
    is renewed, and every operation is a C-level set operation (the manager
    records each freed request's blocks). Hashes are stored as Python
    ``hash`` values (ints, about 60 bytes each with their set slot): the block
    hashes themselves need not outlive their blocks.
    """

    __slots__ = ("_half", "_new", "_old", "capacity", "share")

    def __init__(self, capacity: int, share: float = RETURNING_SHARE) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self.capacity = capacity
        self.share = share
        self._half = capacity // 2
        self._new: set[int] = set()
        self._old: set[int] = set()

    def __len__(self) -> int:
        """Hashes remembered (a renewed one still in the older generation counts twice)."""
        return len(self._new) + len(self._old)

    def returning(self, hashes: Sequence[bytes], block_size: int, num_tokens: int) -> bool:
        """Whether the blocks covering ``share`` of a prompt's ``num_tokens``,
        from its start, were all seen (``hashes``: its whole blocks of
        ``block_size`` tokens). A prompt needing more blocks than it has
        whole ones (a short prompt) is not returning."""
        need = max(1, math.ceil(self.share * num_tokens / block_size))
        if need > len(hashes):
            return False
        missing = set(map(hash, hashes[:need]))
        missing -= self._new
        return missing <= self._old

    def record(self, hashes: Sequence[bytes]) -> None:
        """Remember ``hashes`` as the most recently held (module docstring)."""
        new = self._new
        new.update(map(hash, hashes))
        if len(new) > self._half:
            self._old = new if self._half else set()
            self._new = set()

    def check_integrity(self) -> None:
        assert len(self._new) <= self._half, (
            f"{len(self._new)} hashes in the newer generation, at most {self._half}"
        )
        if not self._half:
            assert not self._old, "capacity below 2 remembers nothing"
