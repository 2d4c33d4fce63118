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
boundary (2,640), where a state is kept (how often: ``docs/hybrid-caching.md``).

The evidence is narrower ranges. Every admitted request *marks* the
full-attention block ending at its prompt's last hit boundary ``E`` with how far
its prompt runs past it (``r``, under ``g``). A later request whose branch is a
marked block shares the marking prompt up to ``E`` and, if it diverges inside
that prompt (the next turn of a conversation that re-renders or replaces the
last message, or a trace's expansion), diverges in ``[E, E + r]``: consistent
with grid ``A`` iff a multiple of ``A`` lies there. (A request that shares the
whole prompt and diverges in its answer counts against every ``A``: right, since
no grid then explains where it resumes.) Over the last ``learn_window`` such
*informative* observations, once there are ``learn_min_observed``, ``align`` is the
largest power of two ``A <= min(g, tail)`` that at least ``grid_agree`` of them are
consistent with and that divergences at random would rarely fit as well: a range
of ``r + 1`` tokens holds a multiple of ``A`` by chance with probability
``min(1, (r + 1) / A)``, and its mean over the observations must be at most
``fine_chance`` (``HybridTuning``): a small ``A`` fits any traffic, and is
refused. Else 0.

A marked prompt end is evidence only when the next turn diverges at or past the
prompt's last hit boundary ``E``. Most of Bamba's next turns diverge in the block
before it, ``[E - g, E)`` (the prompt's last multiple of 512 lies there when
``E`` is past it), and branch at ``E - g``: a range of ``g`` tokens, which every
grid up to ``g`` fits. So every admitted request also *records* that block, as
the hashes of its chunks of ``chunk`` tokens (``max(fine_min_align, g //
fine_chunks_per_block)``), under the hash of the block ending at ``E - g``. A later
request whose branch is not a marked block looks that hash up among its own
block hashes, at its branch and past it (chained hashes: a hit means it shares
everything before the recorded block, whether or not the cache still holds
it), and the deepest record found is compared chunk by chunk with its prompt:
the first differing chunk ``[D, D + chunk)`` is an informative observation
(overhang ``chunk - 1``); a prompt that matches every chunk it holds (it ends
inside the block) is no evidence.

``prompt_point`` then keeps the state where a request that diverges at the last
multiple of ``align`` in the prompt resumes (``kv_cache_manager._kept_points``).
It is used only when no coarse grid is in force. What it earns
(``benchmarks/results/policy-ablation.md``): 0.5-2 points of hit rate on Bamba with the
Mooncake traces, nothing on workloads without a 512-token grid.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable

from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning

#: Bytes per token in a packed prompt (``Request.packed_prompt``: uint32).
TOKEN_BYTES = 4


def chunk_size(granularity: int, tuning: HybridTuning = DEFAULT_TUNING) -> int:
    """Tokens per recorded chunk for full-attention blocks of ``granularity``."""
    return max(tuning.fine_min_align, granularity // tuning.fine_chunks_per_block)


def chunk_hashes(packed: bytes, start: int, stop: int, chunk: int) -> array[int]:
    """Hashes of the whole ``chunk``-token chunks of ``packed`` (uint32 tokens)
    from token ``start`` up to ``stop`` or the end of ``packed``, whichever is
    first (equal chunks hash equal; unequal ones collide with chance 2**-64)."""
    stop = min(stop, len(packed) // TOKEN_BYTES)
    step = chunk * TOKEN_BYTES
    return array(
        "q",
        (
            hash(packed[b : b + step])
            for b in range(start * TOKEN_BYTES, (stop - chunk + 1) * TOKEN_BYTES, step)
        ),
    )


class FineAlignment:
    """Learns a branch grid no coarser than the full-attention block (module docstring).

    ``granularity``: the full-attention block size ``g`` (branches are
    multiples of it); ``tail``: the tail's length in tokens (the coarsest grid
    tried is ``min(g, tail)``); ``learn``: False for a fixed alignment (then
    ``align`` stays 0); ``tuning``: the windows and thresholds (``HybridTuning``).
    """

    __slots__ = (
        "_agree",
        "_candidates",
        "_chance",
        "_marks",
        "_records",
        "_seen",
        "agree",
        "align",
        "chance",
        "chunk",
        "granularity",
        "max_marks",
        "max_records",
        "min_observed",
        "window",
    )

    def __init__(
        self, granularity: int, tail: int, learn: bool = True, tuning: HybridTuning = DEFAULT_TUNING
    ) -> None:
        self.granularity = granularity
        self.window = tuning.learn_window
        self.min_observed = tuning.learn_min_observed
        self.agree = tuning.grid_agree
        self.chance = tuning.fine_chance
        self.max_marks = tuning.max_marks
        self.max_records = tuning.fine_max_records
        learn = learn and tuning.learn_fine_alignment
        cands = []
        a = tuning.fine_min_align
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
        #: Tokens per recorded chunk (``chunk_size``).
        self.chunk = chunk_size(granularity, tuning)
        #: Hash of the block before a recorded one -> the recorded block's chunk hashes.
        self._records: OrderedDict[bytes, array[int]] = OrderedDict()
        #: The grid in force (0: none).
        self.align = 0

    @property
    def learning(self) -> bool:
        """Whether any grid is tried (False: a fixed alignment, or no tail)."""
        return bool(self._candidates)

    def mark(self, key: bytes, overhang: int) -> None:
        """An admitted request's prompt runs ``overhang`` tokens (``< g``) past the
        full-attention block with hash ``key``, which ends its last hit boundary."""
        if not self.learning:
            return
        marks = self._marks
        marks.pop(key, None)
        marks[key] = overhang
        if len(marks) > self.max_marks:
            marks.popitem(last=False)

    def record(self, key: bytes, packed: bytes, start: int) -> None:
        """An admitted request's prompt (``packed``) holds the whole block of
        ``g`` tokens from ``start``, the one before its last hit boundary;
        ``key``: the hash of its block ending at ``start``."""
        if not self.learning:
            return
        records = self._records
        records.pop(key, None)
        records[key] = chunk_hashes(packed, start, start + self.granularity, self.chunk)
        if len(records) > self.max_records:
            records.popitem(last=False)

    def observe(
        self,
        branch: int,
        key: bytes | None,
        packed: bytes | None = None,
        shared: Iterable[tuple[int, bytes]] = (),
    ) -> None:
        """A new request branched after ``branch`` tokens, at the block with hash
        ``key``: informative when a prompt end marked it, else when a block after
        one of its own was recorded and its prompt (``packed``) differs from that
        block (module docstring). ``shared``: ``(x, hash of its block ending at
        x)`` for ``x`` past ``branch``, ascending (the deepest recorded one is
        compared)."""
        overhang = None if key is None else self._marks.get(key)
        if overhang is None:
            if packed is None or not self._records:
                return
            records = self._records
            recorded = None if key is None else records.get(key)
            for x, k in shared:
                r = records.get(k)
                if r is not None:
                    branch, recorded = x, r
            if recorded is None:
                return
            c = self.chunk
            mine = chunk_hashes(packed, branch, branch + self.granularity, c)
            # ``mine`` is shorter where the prompt ends inside the block
            pairs = zip(mine, recorded, strict=False)
            first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
            if first is None:
                return
            branch, overhang = branch + first * c, c - 1
        self._add(branch, overhang)

    def _add(self, branch: int, overhang: int) -> None:
        """Remember one informative observation: a divergence in ``[branch,
        branch + overhang]``."""
        seen, agree, chance = self._seen, self._agree, self._chance
        seen.append((branch, overhang))
        for k, a in enumerate(self._candidates):
            agree[k] += -branch % a <= overhang
            chance[k] += min(a, overhang + 1)
        if len(seen) > self.window:
            old, r = seen.popleft()
            for k, a in enumerate(self._candidates):
                agree[k] -= -old % a <= r
                chance[k] -= min(a, r + 1)
        self.align = self._choose()

    def _choose(self) -> int:
        n = len(self._seen)
        if n < self.min_observed:
            return 0
        align = 0
        for k, a in enumerate(self._candidates):
            if self._agree[k] >= self.agree * n and self._chance[k] <= self.chance * a * n:
                align = a
        return align

    def check_integrity(self) -> None:
        """Counts match the remembered observations; ``align`` matches the counts."""
        assert len(self._seen) <= self.window and len(self._marks) <= self.max_marks
        assert len(self._records) <= self.max_records
        n = self.granularity // self.chunk
        assert all(len(r) == n for r in self._records.values()), "a record is not one block"
        assert all(0 <= r < self.granularity for r in self._marks.values()), "overhang >= g"
        for k, a in enumerate(self._candidates):
            assert self._agree[k] == sum(-b % a <= r for b, r in self._seen), "agreement off"
            assert self._chance[k] == sum(min(a, r + 1) for _, r in self._seen), "chance off"
        assert self.align == self._choose(), "stale alignment"
