"""Returning prompts: requests that continue a prompt the cache has seen.

On conversation traffic, whether a request's prefix will be reused is mostly
whether its conversation goes on, and a conversation that has gone on once
is likely to go on again (on the Mooncake conversation trace far more of
later turns are continued than of first ones: ``docs/hybrid-caching.md``).
A first turn and a later one look alike to recency, so a recency-ranked cache
keeps both equally long and, when memory is short, loses both.

``SeenPrefixes`` tells them apart online. It remembers the hashes of the
blocks the cache has held, evicted or not (metadata, no KV), one block in
``sample_blocks``: block hashes are chained, so a block's hash stands for
the whole prefix it ends, and one sample per ``sample_blocks`` blocks keeps
the same history in ``1 / sample_blocks`` of the memory. The most recent
``capacity / 2`` to ``capacity`` samples are kept, in two generations. A new
request is *returning* when its prompt's first ``share``, rounded up to a
whole sample, was seen before: it continues an earlier prompt rather than
sharing only a common header (a system prompt) with it. One lookup decides.
Cost-aware eviction then values a returning
request's units ``bonus`` pool turnovers longer: their values are multiplied
by ``2 ** (bonus / weight)`` (``HybridPolicy.return_factor``).

A request resumed after preemption keeps the answer of its first admission
(``Request.returning``): its own earlier blocks are no evidence.

*Measured continuation* (``ContinuationRates``, ``learn_return_rates``). The
bonus bets that a returning prompt is continued more often than a first one.
That holds on the Mooncake conversation trace (31 % of first turns continued,
77 % of eighth turns) and fails where every client comes back until it
leaves (``benchmarks/multiturn.py``: there the prompts called returning are
continued less often, 0.81 against 0.90 on Bamba at 8 GB, and the flat bonus
costs up to 9.7 points). So the policy measures both rates online, and a
returning request's bonus is scaled by ``clamp(log_r(returning rate / first
rate), 0, 1)`` (``r``: ``HybridTuning.return_rate_full``): the whole bonus
where returning prompts are continued at least ``r`` times as often, none
where they are not continued more.

*Grades* (``hybrid_return_grade``). ``flat``, the default, keeps every
returning request ``bonus`` turnovers longer. ``turn`` and ``log-turn`` scale
the bonus by the request's turn ``t``, 1 + the turn remembered with the sample
that decided it (a prompt that continues nothing held is turn 0), as
``min(t, max_turn)`` or ``log2(1 + min(t, max_turn))``: continuation climbs
with the turn. Which grade wins depends on the budget, not only on the
traffic (``docs/hybrid-caching.md``), so ``flat`` stays the default, and
``hybridkv simulate --return-grade`` with
``--return-bonus`` and ``--value-weight`` finds the setting for a budget and a
traffic. Only the graded forms remember turns (an int with each sample).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hybridkv.policy.options import RETURN_GRADE_NAMES
from hybridkv.policy.tuning import DEFAULT_TUNING


def sample_keys(hashes: Sequence[bytes], num_blocks: int | None, stride: int) -> list[int]:
    """The ``hash`` of one block hash in ``stride`` among the first
    ``num_blocks`` of ``hashes`` (None: all), each ending a run of ``stride``
    blocks from the start: what ``SeenPrefixes`` and ``ReleaseTimes`` remember
    of a freed request (sampled once, for both: ``record_samples``)."""
    return list(map(hash, hashes[stride - 1 : num_blocks : stride]))


def host_return_share(
    bonus: float, bonus_tokens: int, device_tokens: float, tier_cover: float
) -> float:
    """The share of a returning unit's return factor the host tier keeps. The
    device keeps ``bonus`` turnovers. In the host, a returning unit's whole stay,
    one host turnover plus its bonus, is capped at the reach: the host's bonus is
    ``min(bonus, max(0, bonus_tokens / H - 1))`` host turnovers, ``H`` the host's
    full-attention tokens, ``device_tokens x (tier_cover - 1)``; the share is that
    over ``bonus`` (``host_value`` rescales the factor alone, every other class
    step in the host kept as on the device). A host that holds a whole stay
    within the reach ``bonus + 1`` times keeps the whole bonus (share 1, the rule
    without a reach); a host as large as the reach keeps none. 1.0 without a
    reach, a host or a bonus."""
    if bonus_tokens <= 0 or tier_cover <= 1 or bonus <= 0 or device_tokens <= 0:
        return 1.0
    host_tokens = device_tokens * (tier_cover - 1)
    return min(bonus, max(0.0, bonus_tokens / host_tokens - 1.0)) / bonus


def host_value(value: float, factor: float, share: float) -> float:
    """A demoted unit's value in the host tier: ``value`` (the device's, the
    return ``factor`` inside it) with the factor raised to ``share``
    (``host_return_share``) instead. The factor is ``2 ** (b / weight)`` for a
    bonus of ``b`` device turnovers, so the host keeps ``share x b`` of its own
    turnovers, at the device's weight; a unit with no return factor (1.0) keeps
    its value."""
    if factor == 1.0 or share == 1.0:
        return value
    return value * factor ** (share - 1.0)


def grade(name: str, turn: int, max_turn: int) -> float:
    """``hybrid_return_grade`` ``name``: a returning request of turn ``turn >= 1``
    is kept ``bonus x grade`` pool turnovers longer (module docstring); turns
    beyond ``max_turn`` count as that one."""
    if name == "flat":
        return 1.0
    t = min(turn, max_turn)
    if name == "turn":
        return float(t)
    if name == "log-turn":
        return math.log2(1 + t)
    raise ValueError(f"return grade must be one of {', '.join(RETURN_GRADE_NAMES)}, got {name!r}")


class SeenPrefixes:
    """A bounded memory of the block hashes the cache has held (module docstring).

    ``stride``: one block hash in ``stride`` is kept, the one ending each
    run of ``stride`` blocks from the prompt's start. The hashes passed in
    must be chained (each block's hash determines every token before it, as
    ``hybridkv.core.hashing``'s are), so a sample seen means its whole prefix was.

    Two generations of samples: ``record`` adds to the newer one, and once it
    holds half of ``capacity`` it becomes the older one, the former older one
    being forgotten. So the most recent ``capacity / 2`` to ``capacity``
    samples (plus one request's at most) are remembered, a sample recorded
    again is renewed, and every operation is a C-level set operation (the
    manager records each freed request's blocks). Samples are stored as
    Python ``hash`` values (ints, about 60 bytes each with their set slot):
    the block hashes themselves need not outlive their blocks.
    """

    __slots__ = ("_half", "_new", "_old", "capacity", "max_turn", "share", "stride", "turns")

    def __init__(
        self,
        capacity: int,
        share: float = DEFAULT_TUNING.returning_share,
        stride: int = DEFAULT_TUNING.sample_blocks,
        turns: bool = False,
        max_turn: int = DEFAULT_TUNING.max_turn,
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
        self.turns = turns
        self.max_turn = max_turn
        self._half = capacity // 2
        # Samples (sets), or samples with the turn of the prompt that held them.
        self._new: set[int] | dict[int, int] = {} if turns else set()
        self._old: set[int] | dict[int, int] = {} if turns else set()

    def __len__(self) -> int:
        """Samples remembered (a renewed one still in the older generation counts twice)."""
        return len(self._new) + len(self._old)

    def returning(self, hashes: Sequence[bytes], block_size: int, num_tokens: int) -> int:
        """The prompt's turn if the blocks covering ``share`` of its
        ``num_tokens`` from its start, rounded up to a whole run of ``stride``
        blocks, were seen, else 0 (``hashes``: its whole blocks of
        ``block_size`` tokens, chained): one lookup, of the sample ending that
        run. The turn is 1 + the one recorded with that sample, at most
        ``max_turn``; 1 when turns are not kept. A prompt with fewer whole
        blocks than that (a short prompt) is not returning."""
        need = max(1, math.ceil(self.share * num_tokens / block_size))
        last = -(-need // self.stride) * self.stride - 1
        if last >= len(hashes):
            return 0
        key = hash(hashes[last])
        if not self.turns:
            return int(key in self._new or key in self._old)
        turn = self._new.get(key)  # type: ignore[union-attr]
        if turn is None:
            turn = self._old.get(key)  # type: ignore[union-attr]
        return 0 if turn is None else min(turn + 1, self.max_turn)

    def record(self, hashes: Sequence[bytes], num_blocks: int | None = None, turn: int = 0) -> None:
        """Remember the samples of ``hashes`` (a prefix's chained block
        hashes, from its start; only its first ``num_blocks``, if given) as
        the most recently held, held by a prompt of ``turn`` (kept only when
        turns are)."""
        self.record_samples(sample_keys(hashes, num_blocks, self.stride), turn)

    def record_samples(self, samples: list[int], turn: int = 0) -> None:
        """``record`` of the samples ``sample_keys`` took (this ``stride``)."""
        new = self._new
        if self.turns:
            new.update(dict.fromkeys(samples, turn))
        else:
            new.update(samples)  # type: ignore[arg-type]
        if len(new) > self._half:
            self._old = new if self._half else type(new)()
            self._new = type(new)()

    def check_integrity(self) -> None:
        assert len(self._new) <= self._half, (
            f"{len(self._new)} hashes in the newer generation, at most {self._half}"
        )
        if not self._half:
            assert not self._old, "capacity below 2 remembers nothing"
        for gen in (self._new, self._old):
            assert isinstance(gen, dict) == self.turns, "turns kept in the wrong form"
            if isinstance(gen, dict):
                assert all(0 <= t <= self.max_turn for t in gen.values()), "a turn out of range"


class ContinuationRates:
    """How often prompts called returning, and prompts called first, are continued.

    A freed prompt is *continued* when a later prompt holds its first
    ``share`` (rounded up to a whole run of ``stride`` blocks, as for
    ``SeenPrefixes.returning``): it goes on from it, rather than sharing a
    header. ``record`` notes a freed prompt by that sample, with its class
    (returning or first); ``observe`` looks a new prompt's samples up, deepest
    first, and credits the deepest noted prompt it holds (each noted prompt
    is credited once: continued at all, not how often). A noted prompt that
    ``horizon`` later noted prompts have passed without a continuation
    *expires*: not continued. A class's rate counts only prompts so resolved
    (a prompt noted a moment ago is neither), so both classes are measured
    over the same horizon. A prompt with fewer blocks than its sample run is
    not noted: a continuation of it could not be seen, and counting it would
    lower its class's rate for the detector's blind spot (short first
    prompts), not for what the traffic does.

    Counts are halved each ``window`` noted prompts (they cover the last
    ``window`` to ``2 x window``). ``grade()`` is ``clamp(log_r(rate_returning
    / rate_first), 0, 1)`` with ``r = full_ratio``: 0 where returning prompts
    are continued no more often than first ones, 1 from ``full_ratio`` times
    as often. While a class has fewer than ``min_observed`` resolved prompts,
    the last grade holds (1 before any: the flat bonus, the prior), so a class
    that has become rare (every prompt returning) keeps what was known.
    """

    __slots__ = (
        "_continued",
        "_expired",
        "_pending",
        "_share",
        "_since_halving",
        "full_ratio",
        "horizon",
        "min_observed",
        "share",
        "stride",
        "window",
    )

    def __init__(
        self,
        horizon: int = DEFAULT_TUNING.learn_window,
        window: int = DEFAULT_TUNING.learn_window,
        min_observed: int = DEFAULT_TUNING.learn_min_observed,
        share: float = DEFAULT_TUNING.returning_share,
        stride: int = DEFAULT_TUNING.sample_blocks,
        full_ratio: float = DEFAULT_TUNING.return_rate_full,
    ) -> None:
        if not full_ratio > 1:
            raise ValueError(f"full_ratio must be > 1, got {full_ratio!r}")
        if horizon < 1 or window < 1 or min_observed < 0 or stride < 1:
            raise ValueError(
                "horizon, window and stride must be >= 1 and min_observed >= 0, got "
                f"{horizon!r}, {window!r}, {stride!r}, {min_observed!r}"
            )
        self.horizon, self.window, self.min_observed = horizon, window, min_observed
        self.share, self.stride, self.full_ratio = share, stride, full_ratio
        #: Sample hash -> class (True: returning) of a noted prompt not yet resolved.
        self._pending: dict[int, bool] = {}
        #: Continued and expired prompts per class (index: returning).
        self._continued = [0.0, 0.0]
        self._expired = [0.0, 0.0]
        self._since_halving = 0
        #: The last grade measured (the prior, 1, before any).
        self._share = 1.0

    def __len__(self) -> int:
        """Noted prompts not resolved yet."""
        return len(self._pending)

    def _sample(
        self, hashes: Sequence[bytes], block_size: int, num_tokens: int, num_blocks: int
    ) -> int | None:
        """Index of the sample ending the run that covers ``share`` of
        ``num_tokens`` (None: the prompt has fewer than ``num_blocks`` blocks)."""
        need = max(1, math.ceil(self.share * num_tokens / block_size))
        last = -(-need // self.stride) * self.stride - 1
        return last if last < num_blocks else None

    def record(
        self,
        hashes: Sequence[bytes],
        block_size: int,
        num_tokens: int,
        returning: bool,
        num_blocks: int | None = None,
    ) -> None:
        """Note a freed prompt of ``num_tokens`` (``hashes``: its whole cached
        blocks of ``block_size`` tokens, chained; only the first ``num_blocks``
        if given), called returning or not; the oldest pending prompt past the
        horizon expires."""
        n = len(hashes) if num_blocks is None else min(num_blocks, len(hashes))
        last = self._sample(hashes, block_size, num_tokens, n)
        if last is None:
            return
        pending = self._pending
        key = hash(hashes[last])
        pending.pop(key, None)  # re-noted: it moves to the newest place
        pending[key] = returning
        changed = False  # the grade is a function of the counts: recomputed when they move
        if len(pending) > self.horizon:
            oldest = next(iter(pending))
            self._expired[pending.pop(oldest)] += 1
            changed = True
        self._since_halving += 1
        if self._since_halving >= self.window:
            self._since_halving = 0
            self._continued = [n / 2 for n in self._continued]
            self._expired = [n / 2 for n in self._expired]
            changed = True
        if changed:
            self._update()

    def observe(self, hashes: Sequence[bytes]) -> bool | None:
        """A new prompt (``hashes``: its whole blocks, chained): credit the
        deepest pending prompt it continues; that prompt's class (None: none)."""
        pending = self._pending
        if not pending:
            return None
        stride = self.stride
        for i in range(len(hashes) - (len(hashes) % stride) - 1, -1, -stride):
            cls = pending.pop(hash(hashes[i]), None)
            if cls is not None:
                self._continued[cls] += 1
                self._update()
                return cls
        return None

    def rate(self, returning: bool) -> float | None:
        """The share of the class's resolved prompts that were continued
        (None: fewer than ``min_observed`` resolved)."""
        cont = self._continued[returning]
        resolved = cont + self._expired[returning]
        if resolved < max(1, self.min_observed):
            return None
        return cont / resolved

    def grade(self) -> float:
        """What share of the return bonus returning prompts earn (class docstring)."""
        return self._share

    def _update(self) -> None:
        """Recompute ``grade`` after a count changed (class docstring)."""
        ret, first = self.rate(True), self.rate(False)
        if ret is None or first is None:
            return  # the last grade holds
        if ret <= first:
            self._share = 0.0
        elif first <= 0 or ret >= self.full_ratio * first:
            self._share = 1.0
        else:
            self._share = math.log2(ret / first) / math.log2(self.full_ratio)

    def check_integrity(self) -> None:
        assert len(self._pending) <= self.horizon, "more prompts pending than the horizon"
        assert min(self._continued + self._expired) >= 0, "a negative count"
        assert 0 <= self._share <= 1, f"grade {self._share} out of [0, 1]"
