"""Which steps a graph replays, and the padded shape each is captured at.

Two kinds of step are graphed:

- **decode**: every request adds one token and samples. Padded to a *bucket* of
  sequences (1, 2, 4, 8, then multiples of 8 up to ``max_batch``), each padding row a
  one-token sequence of its own.
- **small**: any other step of at most ``MAX_SMALL_TOKENS`` new tokens: new turns on
  cached conversations (the step a prefix hit leaves), short prompts, and decodes
  batched with them, sampling or not (a prompt's middle chunk). Padded to a token
  bucket (16, 32, ..., 512) and a sequence bucket with at least one *padding
  sequence* more than the step has; the padding tokens (at least one per padding
  sequence) go to the padding sequences, one each but the last, which takes the rest.

Both also carry a *span class*: the power of two (at least ``MIN_SPAN`` keys, at most
``max_model_len``) the attention launcher plans for, so the launch baked into a graph
suits the contexts it replays: the same tiles as an eager step's up to 1,024 keys (the
launcher's short-span rule), a sliding window of at least the class dropped as an eager
step drops it, and a split-KV count whose segments the kernel spreads over the real
contexts (``kernels/attention/launch_rules.py``). Anything else (steps of more tokens: long prompts'
chunks, which the GPU rather than the host bounds) runs eagerly, with the reason
(``StepShape.of``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridkv.engine.scheduler import ScheduledRequest

#: The smallest span class: contexts up to this share one plan. 512, not 2,048 (before
#: 2026-11-28): Gemma 3's 512-key window is then dropped in graphs as eagerly, and
#: head-128 models keep the short-span tiles the H200 sweep chose for up to 1,024 keys;
#: at most two captures more per bucket (512 and 1,024) for contexts that grow past them.
MIN_SPAN = 512
#: Token buckets of small steps.
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512)
MAX_SMALL_TOKENS = TOKEN_BUCKETS[-1] - 1


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
    (``decode``: one each), planned for contexts up to ``span``."""

    tokens: int
    seqs: int
    span: int
    decode: bool

    @staticmethod
    def of(
        work: Sequence[ScheduledRequest], buckets: Sequence[int], max_model_len: int, min_span: int
    ) -> StepShape | str:
        """The shape ``work`` replays at, or why it runs eagerly. ``buckets``: the
        sequence buckets (``bucket_sizes(max_batch + 1)``: a small step of
        ``max_batch`` requests still has room for its padding sequence)."""
        if not work:
            return "empty step"
        longest = max(s.start + s.num_tokens for s in work)
        span = span_class(longest, max_model_len, min_span)
        n, seqs = sum(s.num_tokens for s in work), len(work)
        if n == seqs and all(s.samples for s in work):
            for b in buckets:
                if b >= seqs:
                    return StepShape(b, b, span, decode=True)
            return f"decode batch over {buckets[-1]}"
        padded = next((b for b in buckets if b > seqs), None)
        if padded is None:
            return f"step of over {buckets[-1] - 1} requests"
        for t in TOKEN_BUCKETS:
            if t - n >= padded - seqs and t <= max_model_len:
                return StepShape(t, padded, span, decode=False)
        return f"step of over {min(MAX_SMALL_TOKENS, max_model_len - 1)} new tokens"
