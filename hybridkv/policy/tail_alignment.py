"""Tail alignment: where requests branch off cached prefixes, learned online.

Under ``hybrid``, a freed request keeps a hit point at every hit boundary in
the last ``tail`` tokens before its end (``retention.TAIL_TOKENS``): the next
request that extends it may branch anywhere there. Each such point costs a
Mamba state per Mamba group, or the window's blocks of each sliding group.
When traffic only ever branches at multiples of some ``A`` (fixed-size pages,
as in the Mooncake traces, whose requests share whole 512-token blocks), the
points in between are never hit, and a tail point on such a multiple is all a
follow-up can use. What it earns is that shape's (``benchmarks/results/
policy-ablation.md``): up to 1.7 points on the Mooncake traces, nothing on traffic
without such a grid, where it keeps the dense tail.

Evidence comes free with every admission: a new request's branch point ``F``
(how far full attention alone matched, a multiple of the full-attention block
size ``g``) says it diverges inside ``[F, F + g)``. That is consistent with
alignment ``A`` iff a multiple of ``A`` lies in that range; a uniformly random
divergence is consistent with probability ``g / A``. ``TailAlignment`` keeps
the last ``learn_window`` such observations (only ``0 < F`` with ``F + g`` inside
the prompt: a match cut by the prompt's end says nothing) and, once it has
``learn_min_observed``, adopts the largest power of two ``A`` with ``g < A <= tail``
that at least ``grid_agree`` of them are consistent with; else ``0``: every
boundary (the dense tail). It keeps watching: a change of traffic moves it.

``align`` is what ``FinalPoints`` and Mamba snapshots use (``tail_points``):
``0`` dense, else the tail keeps only boundaries ``p`` with a multiple of
``A`` in ``[p, p + step)`` (``on_grid``), plus the end.
"""

from __future__ import annotations

from collections import deque

from hybridkv.policy.fine_alignment import FineAlignment
from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning


class TailAlignment:
    """Learns (or is fixed at) the alignment of branch points; see the module docstring.

    ``fixed``: ``None`` to learn; ``0`` for the dense tail; ``A > 0`` to keep
    ``A`` whatever is observed. ``tuning``: the window and thresholds, and
    which learners are on (``HybridTuning``).
    """

    __slots__ = (
        "_agree",
        "_candidates",
        "_seen",
        "agree",
        "align",
        "fine",
        "fixed",
        "granularity",
        "min_observed",
        "window",
    )

    def __init__(
        self, granularity: int, tail: int, fixed: int | None, tuning: HybridTuning = DEFAULT_TUNING
    ) -> None:
        self.granularity = granularity
        self.window = tuning.learn_window
        self.min_observed = tuning.learn_min_observed
        self.agree = tuning.grid_agree
        self.fixed = fixed
        #: The alignment in force (0: dense).
        self.align = fixed or 0
        cands = []
        a = 1
        while a <= tail:
            if a > granularity:
                cands.append(a)
            a <<= 1
        learn = fixed is None and tuning.learn_tail_alignment
        self._candidates: tuple[int, ...] = tuple(cands) if learn else ()
        self._seen: deque[int] = deque()
        self._agree = [0] * len(self._candidates)
        #: A grid no coarser than ``granularity`` (``fine_alignment``): where the
        #: prompt-end state goes while no coarse grid is in force.
        self.fine = FineAlignment(granularity, tail, fixed is None, tuning)

    def observe(self, branch: int, num_tokens: int) -> None:
        """A new request matched ``branch`` tokens in full attention and has
        ``num_tokens`` (its prompt so far): record it and update ``align``."""
        if not self._candidates or branch <= 0 or branch + self.granularity >= num_tokens:
            return
        seen, agree, g = self._seen, self._agree, self.granularity
        seen.append(branch)
        for k, a in enumerate(self._candidates):
            agree[k] += -branch % a < g
        if len(seen) > self.window:
            old = seen.popleft()
            for k, a in enumerate(self._candidates):
                agree[k] -= -old % a < g
        align = 0
        if len(seen) >= self.min_observed:
            need = self.agree * len(seen)
            for k, a in enumerate(self._candidates):
                if agree[k] >= need:
                    align = a
        self.align = align

    def check_integrity(self) -> None:
        """The agreement counts match the remembered observations."""
        g = self.granularity
        assert len(self._seen) <= self.window
        for k, a in enumerate(self._candidates):
            assert self._agree[k] == sum(-b % a < g for b in self._seen), "agreement count off"
        assert self.fixed is None or self.align == self.fixed
        self.fine.check_integrity()
