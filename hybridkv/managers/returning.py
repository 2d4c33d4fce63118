"""Returning prompts: requests that continue a prompt the cache has seen.

On conversation traffic, whether a request's prefix will be reused is mostly
whether its conversation goes on, and a conversation that has gone on once
is likely to go on again. On the Mooncake conversation trace 31 % of first
turns are continued, 77 % of eighth turns (``bench_reuse_predictors.py``'s
``Conversations``). A first turn and a later one look alike to recency, so a
recency-ranked cache keeps both equally long and, when memory is short, loses
both.

``SeenPrefixes`` tells them apart online. It remembers the hashes of the
blocks the cache has held, evicted or not (metadata, no KV), one block in
``SAMPLE_BLOCKS``: block hashes are chained, so a block's hash stands for
the whole prefix it ends, and one sample per ``SAMPLE_BLOCKS`` blocks keeps
the same history in ``1 / SAMPLE_BLOCKS`` of the memory. The most recent
``capacity / 2`` to ``capacity`` samples are kept, in two generations. A new
request is *returning* when its prompt's first ``share``, rounded up to a
whole sample, was seen before: it continues an earlier prompt rather than
sharing only a common header (a system prompt) with it. One lookup decides.
Cost-aware eviction then values a returning
request's units ``bonus`` pool turnovers longer: their values are multiplied
by ``2 ** (bonus / weight)`` (``KVCacheCoordinator.return_factor``). The
whole trace, all-full-attention replay of
``benchmarks/bench_reuse_predictors.py`` (Jamba's pages): recency 10.77 % at
40 GB, with returning requests kept 4 turnovers longer 16.20 %; 20.84 % and
21.51 % at 80 GB. ``hybrid`` itself, Jamba: 10.44 % -> 15.94 % and
19.64 % -> 20.73 % (``results/cache.md``).

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
#: Blocks of history remembered per block of the pool (``SAMPLE_BLOCKS``
#: of them per stored hash).
SEEN_PER_BLOCK = 8
#: One block hash in this many is remembered (the one that ends each run of
#: ``SAMPLE_BLOCKS`` blocks): a 16-token block layout samples every 128
#: tokens, Jamba's 80-token one every 640. The whole-trace Jamba hit rates
#: are unchanged from recording every block (``results/cache.md``).
SAMPLE_BLOCKS = 8


class SeenPrefixes:
    """A bounded memory of the block hashes the cache has held (module docstring).

    ``stride``: one block hash in ``stride`` is kept, the one ending each
    run of ``stride`` blocks from the prompt's start. The hashes passed in
    must be chained (each block's hash determines every token before it, as
    ``hybridkv.hashing``'s are), so a sample seen means its whole prefix was.

    Two generations of samples: ``record`` adds to the newer one, and once it
    holds half of ``capacity`` it becomes the older one, the former older one
    being forgotten. So the most recent ``capacity / 2`` to ``capacity``
    samples (plus one request's at most) are remembered, a sample recorded
    again is renewed, and every operation is a C-level set operation (the
    manager records each freed request's blocks). Samples are stored as
    Python ``hash`` values (ints, about 60 bytes each with their set slot):
    the block hashes themselves need not outlive their blocks.
    """

    __slots__ = ("_half", "_new", "_old", "capacity", "share", "stride")

    def __init__(
        self, capacity: int, share: float = RETURNING_SHARE, stride: int = SAMPLE_BLOCKS
    ) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"stride must be an integer >= 1, got {stride!r}")
        self.capacity = capacity
        self.share = share
        self.stride = stride
        self._half = capacity // 2
        self._new: set[int] = set()
        self._old: set[int] = set()

    def __len__(self) -> int:
        """Samples remembered (a renewed one still in the older generation counts twice)."""
        return len(self._new) + len(self._old)

    def returning(self, hashes: Sequence[bytes], block_size: int, num_tokens: int) -> bool:
        """Whether the blocks covering ``share`` of a prompt's ``num_tokens``
        from its start, rounded up to a whole run of ``stride`` blocks, were
        seen (``hashes``: its whole blocks of ``block_size`` tokens, chained):
        one lookup, of the sample ending that run. A prompt with fewer whole
        blocks than that (a short prompt) is not returning."""
        need = max(1, math.ceil(self.share * num_tokens / block_size))
        last = -(-need // self.stride) * self.stride - 1
        if last >= len(hashes):
            return False
        key = hash(hashes[last])
        return key in self._new or key in self._old

    def record(self, hashes: Sequence[bytes], num_blocks: int | None = None) -> None:
        """Remember the samples of ``hashes`` (a prefix's chained block
        hashes, from its start; only its first ``num_blocks``, if given) as
        the most recently held."""
        new = self._new
        stride = self.stride
        new.update(map(hash, hashes[stride - 1 : num_blocks : stride]))
        if len(new) > self._half:
            self._old = new if self._half else set()
            self._new = set()

    def check_integrity(self) -> None:
        assert len(self._new) <= self._half, (
            f"{len(self._new)} hashes in the newer generation, at most {self._half}"
        )
        if not self._half:
            assert not self._old, "capacity below 2 remembers nothing"
