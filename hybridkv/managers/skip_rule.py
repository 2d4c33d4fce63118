"""``SkipRule``: the one rule a layer kind defines, and what a running request holds by it.

A kind says which leading tokens a query no longer reads
(``get_num_skipped_tokens``); everything else here follows from that and from
the cache policy's ``Hold``: the first table entry a query reads, when the next
release can happen at the earliest, where releases stop (``hybrid``: a running
request keeps what its last hit boundary below ``tail`` needs) and which table
ranges the kept points' hits need. Block table of one request (``block_size``
4, window 6, 13 computed tokens)::

    tokens   0123 4567 89ab c
    blocks   [ 0 ][ 7 ][ 9 ][ 4 ]      first needed token: 13 - 6 + 1 = 8
              ^null: tokens 0-7 are never read again, block freed

Every method is a pure function of the rule, the hold and the state passed in
(the kept spans are memoised); ``SingleTypeKVCacheManager`` (``base.py``), which
is a ``SkipRule``, acts on the answers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from hybridkv.managers.points import Hold, in_spans, kept_spans
from hybridkv.managers.state import NEVER, RequestBlockState

#: Kept-point tuples whose spans a manager remembers (then it starts afresh).
_SPANS_MEMO_SIZE = 4096


class SkipRule(ABC):
    """Which table entries a query reads, and which a running request holds."""

    #: False when ``get_num_skipped_tokens`` is always 0 (nothing to release).
    has_skips: ClassVar[bool] = True

    def __init__(self, block_size: int, hold: Hold | None) -> None:
        self.block_size = block_size
        #: The cache policy keeps points (``hold`` given): running requests hold
        #: what their last hit boundary below ``tail`` needs and retain blocks
        #: of kept points; the rest is released evict-first.
        self.hybrid = hold is not None
        #: Tokens before the end whose hit points a running request keeps whole.
        self.tail = hold.tail if hold is not None else 0
        #: Hit lengths are multiples of this (every group's block size).
        self.hit_step = hold.step if hold is not None else block_size
        #: ``kept_spans`` by kept points (a request's are asked for every step).
        self._spans_memo: dict[tuple[int, ...], tuple[tuple[int, int], ...]] = {}

    @abstractmethod
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens that the query at ``num_computed_tokens`` never reads.

        Must be non-decreasing in ``num_computed_tokens`` and at most it.
        """

    def first_needed_block(self, num_tokens: int) -> int:
        """Table index of the first block a query at ``num_tokens`` reads."""
        return self.get_num_skipped_tokens(num_tokens) // self.block_size

    def free_point_period(self) -> int:
        """Hits at multiples of this many tokens need no block of this group
        beyond the full-attention-like prefix it shares with the others
        (``first_needed_block(p) == p // block_size``): 1 for a group without
        skips (every point), 0 when only the empty hit is (a window, a state).
        ``hybrid`` keeps such *free points* for nothing (``retention.FinalPoints``)."""
        return 0 if self.has_skips else 1

    def min_tokens_skipping(self, num_skipped: int) -> int:
        """A lower bound on the fewest tokens at which ``get_num_skipped_tokens``
        reaches ``num_skipped`` (> 0): ``num_skipped`` itself, as no length skips
        more than itself. Kinds override it with the exact value; a lower bound
        only makes ``next_release_at`` earlier (the fast path rarer), never wrong."""
        return num_skipped

    def next_release_at(self, st: RequestBlockState) -> int:
        """The fewest computed tokens at which ``release_stop`` could pass
        ``st.num_skipped`` (``NEVER`` for a kind without skips). Never above the
        true point: below it, ``remove_skipped_blocks`` has nothing to do."""
        if not self.has_skips:
            return NEVER
        n = self.min_tokens_skipping((st.num_skipped + 1) * self.block_size)
        if not self.hybrid or not st.holds_tail:
            return n
        step = self.hit_step
        return self.tail + -(-n // step) * step

    def release_stop(
        self, st: RequestBlockState, total_computed_tokens: int, lean: bool = False
    ) -> int:
        """Table entries before this index are released once ``total_computed_tokens``
        are computed. ``hybrid`` keeps the last hit boundary's needs too, unless the
        request gave its tail up (``st.holds_tail`` False) or ``lean`` (as if it had)."""
        n = total_computed_tokens
        if self.hybrid and st.holds_tail and not lean:
            n -= self.tail
            n = n - n % self.hit_step if n > 0 else 0
        return min(self.first_needed_block(n), len(st.blocks))

    def kept_spans(self, kept: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """The table ranges the kept points' hits need (``hybrid``; else none)."""
        if not self.hybrid or not kept:
            return ()
        spans = self._spans_memo.get(kept)
        if spans is None:
            if len(self._spans_memo) >= _SPANS_MEMO_SIZE:
                self._spans_memo.clear()
            spans = kept_spans(kept, self.first_needed_block, self.block_size)
            self._spans_memo[kept] = spans
        return spans

    def is_kept(self, kept: tuple[int, ...], index: int) -> bool:
        """True when a kept point's hit needs table entry ``index`` (``hybrid``)."""
        return in_spans(self.kept_spans(kept), index)
