"""Which steps a graph replays, and the padded shape each is captured at.

Two kinds of step are graphed:

- **decode**: every request adds one token and samples. Padded to a *bucket* of
  sequences (1, 2, 4, 8, then multiples of 8 up to ``max_batch``), each padding row a
  one-token sequence of its own.
- **short prefill**: one request adds at most ``MAX_PREFILL_TOKENS`` tokens and
  samples (a new turn on a cached conversation: the step a prefix hit leaves). Padded
  to a token bucket (16, 32, ..., 512) with room for at least one padding token, which
  all go to a second, dummy sequence.

Both also carry a *span class*: the power of two (at least ``MIN_SPAN`` keys, at most
``max_model_len``) the attention launcher plans a split-KV decode for, so the launch
baked into a graph suits the contexts it replays. Anything else runs eagerly, with
the reason (``StepShape.of``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridkv.engine.scheduler import ScheduledRequest

#: The smallest span class: contexts up to this share one plan.
MIN_SPAN = 2048
#: Token buckets of short prefills.
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)
MAX_PREFILL_TOKENS = PREFILL_BUCKETS[-1] - 1


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 24, 32, ... up to ``max_batch`` (always included)."""
    sizes = [b for b in (1, 2, 4) if b < max_batch]
    sizes += range(8, max_batch, 8)
    return (*sizes, max_batch)


def span_class(max_seq_len: int, max_model_len: int, min_span: int = MIN_SPAN) -> int:
    """The power of two (at least ``min_span``) a step's longest context plans for,
    at most ``max_model_len``."""
    span = min_span
    while span < max_seq_len:
        span *= 2
    return min(span, max_model_len)


@dataclass(frozen=True)
class StepShape:
    """A captured step's padded shape: ``tokens`` new tokens of ``seqs`` sequences
    (``decode``: one each; else one real sequence and one dummy), planned for
    contexts up to ``span``."""

    tokens: int
    seqs: int
    span: int
    decode: bool

    @staticmethod
    def of(
        work: Sequence[ScheduledRequest], buckets: Sequence[int], max_model_len: int, min_span: int
    ) -> StepShape | str:
        """The shape ``work`` replays at, or why it runs eagerly."""
        if not work:
            return "empty step"
        if not all(s.samples for s in work):
            return "a request that does not sample"
        longest = max(s.start + s.num_tokens for s in work)
        span = span_class(longest, max_model_len, min_span)
        if all(s.num_tokens == 1 for s in work):
            for b in buckets:
                if b >= len(work):
                    return StepShape(b, b, span, decode=True)
            return f"decode batch over {buckets[-1]}"
        if len(work) > 1:
            return "prefill or mixed step of several requests"
        n = work[0].num_tokens
        for t in PREFILL_BUCKETS:
            if n < t <= max_model_len:
                return StepShape(t, 2, span, decode=False)
        return f"prefill of over {min(MAX_PREFILL_TOKENS, max_model_len - 1)} tokens"
