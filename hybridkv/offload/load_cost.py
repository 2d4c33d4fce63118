"""``LoadCost``: is loading a hit from the tiers cheaper than recomputing it?

The model, in seconds::

    load(bytes)       = bytes / load_bandwidth
    recompute(tokens) = tokens * seconds_per_prefill_token

- ``load_bandwidth`` (bytes/s) starts at ``LoadCostPrior``'s figure for the
  device (each with its source there: a measured CPU reading, a published
  pinned-copy figure on CUDA) and then follows what this engine measures: each
  restored hit staged and landed within one step (``TieredCache.prepare``)
  gives ``bytes loaded / (decided -> blocks usable)`` (``OffloadStats.load_seconds``:
  pins, copies and landing included), folded in as an exponential moving average (``ALPHA``).
  (A hit that lands a step or more later is not measured: its time would
  include the steps in between.) Hits the step
  waited for on the copy stream (CUDA) are not measured: the host did not see
  the copy end.
- ``seconds_per_prefill_token`` is measured only: each step whose tokens are
  mostly prefill (``prefill_tokens >= tokens / 2``, at least
  ``MIN_PREFILL_TOKENS``) gives ``step seconds / step tokens`` (model, sampler
  and scheduling together), averaged the same way. It ignores attention's
  quadratic term (a long context's recompute costs more per token than a
  short one's), which errs toward recomputing. Until a step is measured there
  is no recompute figure, and every load is taken (the behaviour before this
  model existed).

Two decisions use it (``TieredCache``): a tier hit is loaded only if
``load(its unit bytes) < recompute(its tokens past the device hit)`` (else the
tokens are recomputed and ``skipped_slower`` counts it); a preempted request's
units the pool would lose are copied only if ``2 * load(their bytes)`` (out
now, back on resume) is below ``recompute(the tokens they keep)``
(``swap_decision.py``).

The start figure matters between the first measured prefill step and the first
measured load, and more if it is too low: a load it declines is not made, so
it is not measured either, and the figure stays. Measured against it: on the
CPU a unit of 16 tokens of the demo's Gemma 3 270M (48 KiB) loads in about
6 us at the prior and recomputes in about 65 ms (``tiers-ttft.md``'s cold
prefill, 8.4 s for 2,048 tokens), so no CPU model near it declines a load.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of each new measurement in the moving averages.
ALPHA = 0.25
#: A step gives a recompute figure only with at least this many prefill tokens.
MIN_PREFILL_TOKENS = 16


@dataclass(frozen=True, slots=True)
class LoadCostPrior:
    """Load bandwidths used until the engine has measured its own (bytes/s)."""

    #: The CPU engine's whole host-tier load (decided -> blocks usable, what
    #: ``observe_load`` measures), median hit of the demo's Gemma 3 270M, 2k
    #: tokens, 288 units of 48 KiB: 8.49 GB/s (benchmarks/results/tiers-ttft.md,
    #: the 2026-11-27 21:41-21:57 UTC reading, ``bench_tier_ttft.py``; was 0.65
    #: GB/s before that session's faster load path).
    cpu: float = 8.49e9
    #: Pinned host-to-device copies over PCIe Gen4 x16 (the simulator's A100
    #: profile, sim/devices.py; a Gen5 H100 is faster): 25 GB/s.
    cuda: float = 25e9


DEFAULT_PRIOR = LoadCostPrior()


class LoadCost:
    """The load-versus-recompute model of one engine (module docstring)."""

    def __init__(self, cuda: bool, prior: LoadCostPrior = DEFAULT_PRIOR) -> None:
        self.load_bandwidth = prior.cuda if cuda else prior.cpu
        self.seconds_per_token: float | None = None
        self.load_samples = 0
        self.step_samples = 0

    def observe_load(self, nbytes: int, seconds: float) -> None:
        """A hit's ``nbytes`` were usable ``seconds`` after its load was decided."""
        if nbytes > 0 and seconds > 0:
            bw = nbytes / seconds
            self.load_bandwidth += ALPHA * (bw - self.load_bandwidth)
            self.load_samples += 1

    def observe_step(self, tokens: int, prefill_tokens: int, seconds: float) -> None:
        """A step of ``tokens`` tokens, ``prefill_tokens`` of them prefill, took ``seconds``."""
        if prefill_tokens < max(MIN_PREFILL_TOKENS, tokens / 2) or seconds <= 0:
            return
        per = seconds / tokens
        old = self.seconds_per_token
        self.seconds_per_token = per if old is None else old + ALPHA * (per - old)
        self.step_samples += 1

    def load_seconds(self, nbytes: int) -> float:
        return nbytes / self.load_bandwidth

    def recompute_seconds(self, tokens: int) -> float | None:
        """None: no step measured yet."""
        per = self.seconds_per_token
        return None if per is None else tokens * per

    def load_cheaper(self, nbytes: int, tokens: int, copies: int = 1) -> bool:
        """True when ``copies`` copies of ``nbytes`` cost less than recomputing
        ``tokens`` (or nothing is measured yet)."""
        recompute = self.recompute_seconds(tokens)
        return recompute is None or copies * self.load_seconds(nbytes) < recompute
