"""Fine alignment: a branch grid finer than the hit step, learned from prompt ends.

``tail_alignment`` learns a grid ``A`` of branch points coarser than the
full-attention block ``g`` (``g < A``): a branch seen at ``F`` says the new
request diverged inside ``[F, F + g)``, and a random divergence falls on a
multiple of ``A`` there with probability ``g / A``. A grid at or below ``g``
cannot be learned that way: every range of ``g`` tokens holds a multiple of it.
Yet such a grid still decides where a state is worth keeping when the hit step
is coarse. Bamba 9B's hit step is 528 tokens; the Mooncake traces share
prefixes in 512-token units, so the next turn of a 2,651-token prompt diverges
at 2,560 and resumes from the state at 2,112, not from the prompt's last hit
boundary (2,640), where a state is kept today. Roughly half of all next turns
miss that way (whole conversation trace, Bamba 9B at 80 GB: 2.2M of the 3.0M
tokens that full attention matched without a state to resume from).

The evidence is narrower ranges. Every admitted request *marks* the
full-attention block ending at its prompt's last hit boundary ``E`` with how far
its prompt runs past it (``r``, under ``g``). A later request whose branch is a
marked block shares the marking prompt up to ``E`` and, if it diverges inside
that prompt (the next turn of a conversation that re-renders or replaces the
last message, or a trace's expansion), diverges in ``[E, E + r]``: consistent
with grid ``A`` iff a multiple of ``A`` lies there. (A request that shares the
whole prompt and diverges in its answer counts against every ``A``: right, since
no grid then explains where it resumes.) Over the last ``WINDOW`` such
*informative* observations, once there are ``MIN_OBSERVED``, ``align`` is the
largest power of two ``A <= min(g, tail)`` that at least ``AGREE`` of them are
consistent with and that divergences at random would rarely fit as well: a range
of ``r + 1`` tokens holds a multiple of ``A`` by chance with probability
``min(1, (r + 1) / A)``, and its mean over the observations must be at most
``CHANCE``. (On the Mooncake trace, Bamba's ``A = 512`` fits every observation
against a chance of about a half; a small ``A`` fits any traffic, and is
refused.) Else 0.

``prompt_point`` then keeps the state where a request that diverges at the last
multiple of ``align`` in the prompt resumes (``kv_cache_manager._kept_points``).
It is used only when no coarse grid is in force.
"""

from __future__ import annotations

from collections import OrderedDict, deque

#: Informative observations remembered (the most recent ones).
WINDOW = 256
#: Informative observations needed before a grid is adopted.
MIN_OBSERVED = 32
#: Share of informative observations a grid must explain.
AGREE = 0.9
#: Largest mean chance that random divergences fit a grid that is adopted.
CHANCE = 0.8
#: Prompt ends remembered (the most recent; one per admitted request).
MAX_MARKS = 16384
#: The finest grid tried.
MIN_ALIGN = 4


class FineAlignment:
    """Learns a branch grid no coarser than the full-attention block (module docstring).

    ``granularity``: the full-attention block size ``g`` (branches are
    multiples of it); ``tail``: the tail's length in tokens (the coarsest grid
    tried is ``min(g, tail)``); ``learn``: False for a fixed alignment (then
    ``align`` stays 0).
    """

    __slots__ = ("_agree", "_candidates", "_chance", "_marks", "_seen", "align", "granularity")

    def __init__(self, granularity: int, tail: int, learn: bool = True) -> None:
        self.granularity = granularity
        cands = []
        a = MIN_ALIGN
        while learn and a <= min(granularity, tail):
            cands.append(a)
            a <<= 1
        self._candidates: tuple[int, ...] = tuple(cands)
        self._agree = [0] * len(cands)
        #: Per candidate ``A``: the sum of ``min(A, r + 1)`` over the observations.
        self._chance = [0] * len(cands)
        #: ``(branch, overhang)`` of the remembered informative observations.
        self._seen: deque[tuple[int, int]] = deque()
        self._marks: OrderedDict[bytes, int] = OrderedDict()
        #: The grid in force (0: none).
        self.align = 0

    def mark(self, key: bytes, overhang: int) -> None:
        """An admitted request's prompt runs ``overhang`` tokens (``< g``) past the
        full-attention block with hash ``key``, which ends its last hit boundary."""
        if not self._candidates:
            return
        marks = self._marks
        marks.pop(key, None)
        marks[key] = overhang
        if len(marks) > MAX_MARKS:
            marks.popitem(last=False)

    def observe(self, branch: int, key: bytes) -> None:
        """A new request branched after ``branch`` tokens, at the block with hash
        ``key``: informative when a prompt end marked it."""
        overhang = self._marks.get(key)
        if overhang is None:
            return
        seen, agree, chance = self._seen, self._agree, self._chance
        seen.append((branch, overhang))
        for k, a in enumerate(self._candidates):
            agree[k] += -branch % a <= overhang
            chance[k] += min(a, overhang + 1)
        if len(seen) > WINDOW:
            old, r = seen.popleft()
            for k, a in enumerate(self._candidates):
                agree[k] -= -old % a <= r
                chance[k] -= min(a, r + 1)
        self.align = self._choose()

    def _choose(self) -> int:
        n = len(self._seen)
        if n < MIN_OBSERVED:
            return 0
        align = 0
        for k, a in enumerate(self._candidates):
            if self._agree[k] >= AGREE * n and self._chance[k] <= CHANCE * a * n:
                align = a
        return align

    def check_integrity(self) -> None:
        """Counts match the remembered observations; ``align`` matches the counts."""
        assert len(self._seen) <= WINDOW and len(self._marks) <= MAX_MARKS
        assert all(0 <= r < self.granularity for r in self._marks.values()), "overhang >= g"
        for k, a in enumerate(self._candidates):
            assert self._agree[k] == sum(-b % a <= r for b, r in self._seen), "agreement off"
            assert self._chance[k] == sum(min(a, r + 1) for _, r in self._seen), "chance off"
        assert self.align == self._choose(), "stale alignment"
