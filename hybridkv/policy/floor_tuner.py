"""Floor tuning: the snapshot floor's spacing, learned online from the hits it serves.

Under ``hybrid``, every request keeps a hit point every ``S`` tokens below its end
(the snapshot floor, ``retention.floor_spacing``): a later request that shares a
prefix and branches where no request ended or branched before resumes at the floor
point below its branch. A point costs ``c`` full-attention tokens' worth of pages
(its Mamba states or window blocks), so the floor costs ``c / S`` of the memory its
prefixes ride on, and a denser one costs more. What it is worth depends on where
traffic branches: inside long shared documents (Mooncake's synthetic trace), half
the spacing recovers about half of what the floor misses; where conversations
resume at their last prompt's end (the conversation trace), the floor is rarely
what a hit uses.

Evidence comes free with every admission (``observe``): how far full attention
alone matched (``M``, the branch) and the hit ``H``. Over the requests seen, the
tuner sums, per prompt token,

- *what halving would add*: for a request served as well as the floor at ``S``
  could (``H >= floor(M, S)``, so the floor's states were there), the tokens a
  point every ``S / 2`` would have added, ``floor(M, S / 2) - H`` (where
  positive). A request whose floor point had been evicted says nothing about a
  denser floor: its points would be gone too;
- *what going back would lose*: for a request served at least as well as the
  sparser level ``S'`` could and no better than the floor at ``S`` could
  (``floor(M, S') <= H <= floor(M, S)``), the ``floor(M, S) - floor(M, S')``
  tokens between the two. Like the gain, it counts what the points would give if
  they were there: just after a halving, the denser points of earlier prompts do
  not exist yet, and counting only the hits they served would send the spacing
  straight back.

Each is weighed against the memory the change moves, ``c / S`` per level, priced
at the hit rate seen (a share of memory lost loses about that share of the hits,
times ``floor_alpha``): it halves ``S`` when the gain exceeds
``floor_hysteresis`` x the price, doubles it back when the loss is below
``1 / floor_hysteresis`` x the price saved. It decides every ``floor_window``
admissions and remembers the past with weight ``floor_decay`` per window, so it
follows a change of traffic. ``S`` moves one level at a time along ``levels``:
``S0``, then each half of the one before rounded down to the
hit step, while at least ``S0 // floor_min_divisor``. (The settings are
``HybridTuning``'s ``floor_*`` fields; what each was measured to do:
``docs/hybrid-caching.md``.)
"""

from __future__ import annotations

from hybridkv.policy.tuning import DEFAULT_TUNING, HybridTuning


def _below(x: int, step: int) -> int:
    """The largest multiple of ``step`` at or below ``x``."""
    return x - x % step


class FloorTuner:
    """The floor's spacing ``spacing`` (module docstring), starting at ``base``.

    ``point_cost``: what one floor point holds outside full attention, in
    full-attention tokens (its pages over full attention's pages per token);
    ``step``: the hit step (every spacing is a multiple of it); ``tuning``:
    ``floor_window``, ``floor_decay``, ``floor_hysteresis``, ``floor_alpha``,
    ``floor_min_divisor`` (``HybridTuning``).
    """

    def __init__(
        self, base: int, point_cost: float, step: int, tuning: HybridTuning = DEFAULT_TUNING
    ) -> None:
        if base < step or base % step:
            raise ValueError(f"base spacing {base} must be a positive multiple of {step}")
        if point_cost <= 0:
            raise ValueError(f"point_cost must be > 0, got {point_cost}")
        self.base = base
        self.point_cost = point_cost
        self.step = step
        self.window = tuning.floor_window
        self.decay = tuning.floor_decay
        self.hysteresis = tuning.floor_hysteresis
        self.alpha = tuning.floor_alpha
        self.min_divisor = tuning.floor_min_divisor
        #: The spacings it may take, sparsest first; ``spacing`` is ``levels[level]``.
        self.levels = [base]
        while (nxt := _below(self.levels[-1] // 2, step)) >= max(step, base // self.min_divisor):
            self.levels.append(nxt)
        self.level = 0
        self.gain_halving = 0.0
        self.loss_doubling = 0.0
        self.prompt_tokens = 0.0
        self.hit_tokens = 0.0
        self.count = 0

    @property
    def spacing(self) -> int:
        """Tokens between two floor points now."""
        return self.levels[self.level]

    def observe(self, full_match: int, hit: int, prompt_tokens: int) -> int:
        """One admission: full attention matched ``full_match`` tokens, the hit is
        ``hit``, of a request of ``prompt_tokens`` tokens (its prompt at a first
        admission; with its outputs when it resumes after preemption, since its hit
        may cover them: the hit never exceeds it). Returns the spacing in force
        for the admissions that follow."""
        s = self.spacing
        m = _below(full_match, self.step)
        if hit >= _below(m, s) and self.level + 1 < len(self.levels):
            self.gain_halving += max(0, _below(m, self.levels[self.level + 1]) - hit)
        if self.level:
            wide = _below(m, self.levels[self.level - 1])
            if wide <= hit <= _below(m, s):
                self.loss_doubling += _below(m, s) - wide
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit
        self.count += 1
        if self.count >= self.window:
            self._decide()
        return self.spacing

    def _decide(self) -> None:
        s = self.spacing
        if self.prompt_tokens:
            half = self.levels[min(self.level + 1, len(self.levels) - 1)]
            wide = self.levels[max(self.level - 1, 0)]
            rate = self.hit_tokens / self.prompt_tokens
            # Memory the change moves, as a share of full attention's, priced at the hit rate.
            price_halving = self.alpha * (self.point_cost / half - self.point_cost / s) * rate
            price_doubling = self.alpha * (self.point_cost / s - self.point_cost / wide) * rate
            gain = self.gain_halving / self.prompt_tokens
            loss = self.loss_doubling / self.prompt_tokens
            if half < s and gain > self.hysteresis * price_halving:
                self.level += 1
            elif wide > s and loss < price_doubling / self.hysteresis:
                self.level -= 1
        self.gain_halving *= self.decay
        self.loss_doubling *= self.decay
        self.prompt_tokens *= self.decay
        self.hit_tokens *= self.decay
        self.count = 0

    def check_integrity(self) -> None:
        assert 0 <= self.level < len(self.levels), "level out of bounds"
        assert self.levels[0] == self.base, "the sparsest level is the base"
        for wide, half in zip(self.levels, self.levels[1:], strict=False):
            assert half == _below(wide // 2, self.step) >= self.base // self.min_divisor, "levels"
        assert all(s % self.step == 0 and s >= self.step for s in self.levels), "off the step"
        assert 0 <= self.count < self.window, "a decision was skipped"
        assert min(self.gain_halving, self.loss_doubling, self.hit_tokens) >= 0
        assert self.hit_tokens <= self.prompt_tokens + 1e-6 * max(1.0, self.prompt_tokens)
