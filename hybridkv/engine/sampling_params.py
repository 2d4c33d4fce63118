"""``SamplingParams``: how one request samples and when it stops (vLLM names).

``temperature=0`` is greedy. ``top_k=0``/``-1`` and ``top_p=1`` disable those
filters. ``stop_token_ids`` end a request, as does the tokenizer's end of
sequence unless ``ignore_eos``. Invalid values raise ``ValueError`` naming the
field.

Logit processing (vLLM's semantics and order, ``hybridkv.engine.penalties``),
applied to the raw logits before greedy choice or temperature:

1. ``min_tokens``: until that many tokens are out, the stop tokens (and the end
   of sequence unless ``ignore_eos``) cannot be sampled;
2. ``logit_bias``: ``{token id: bias}`` added to the logits (bias in [-100, 100]);
3. ``repetition_penalty`` (> 0; 1 is off): a logit of a token seen in the prompt
   or the output is divided by it when positive, multiplied when not;
4. ``frequency_penalty`` (in [-2, 2]): minus the penalty times the token's count
   in the output so far;
5. ``presence_penalty`` (in [-2, 2]): minus the penalty once for every token
   present in the output so far.

``logprobs=k`` (0 to ``MAX_LOGPROBS``) returns, for each output token, the
log-probabilities of the sampled token and of the ``k`` most likely ones
(``CompletionOutput.logprobs``). As vLLM's default (``logprobs_mode=
"raw_logprobs"``), they are ``log_softmax`` of the model's raw logits: before
penalties, bias, temperature and top-k/top-p.

``n`` samples per prompt share the prompt's KV blocks through the prefix
cache: the first computes the prompt, the others hit its blocks (with prefix
caching off each computes it again). Sample ``i`` samples with ``seed + i``
when ``seed`` is set (vLLM's rule): the samples differ, and each is
reproducible.

What ``seed`` guarantees, exactly:

- The request draws from its own generator (seeded with ``seed``, never
  touched by other requests): given the same logits, it picks the same
  tokens whatever else is in the batch and wherever its row is
  (``tests/hardening/test_batch_invariance.py``).
- The same calls on a fresh engine with the same arguments (dtype, kernel
  backend, threads, prefix caching) give the same tokens, seeded or greedy.
- Batching, preemption and prefix-cache hits are *not* guaranteed to keep a
  request's tokens: they change which tokens a step computes together, and
  the CPU kernels' rounding depends on that (oneDNN/MKL matmuls block by the
  number of rows; a prefix hit or preemption changes prefill chunking). The
  logits then differ in the last bits: in bfloat16 (the demo's dtype) this
  often changes a seeded request's tokens and sometimes a greedy one's; in
  float32 the differences are ~1e-6 relative and rarely change a token.
  There is no batch-invariant mode yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hybridkv.core.token_ids import as_token_id_list, token_id

#: The seeds a ``torch.Generator`` takes: ``[-2**63, 2**64)``.
SEED_MIN, SEED_END = -(2**63), 2**64
#: The most log-probabilities a request may ask for per token (vLLM's default
#: ``max_logprobs``; OpenAI's chat API allows 20 ``top_logprobs``).
MAX_LOGPROBS = 20
#: The largest ``abs(bias)`` of ``logit_bias`` (OpenAI's range).
MAX_LOGIT_BIAS = 100.0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number_in(value: object, lo: float, hi: float, name: str) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and lo <= value <= hi):  # type: ignore[operator, arg-type]
        raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], got {value!r}")


def _checked_bias(bias: object) -> dict[int, float]:
    if not isinstance(bias, Mapping):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got {bias!r}")
    out = {}
    for key, value in bias.items():
        tid = token_id(key, "logit_bias keys")
        _number_in(value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS, f"logit_bias[{tid}]")
        out[tid] = float(value)
    return out


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping settings of a request (see the module docstring)."""

    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = field(default=None, hash=False)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens!r}"
            )
        if not isinstance(self.temperature, int | float) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= -1 (0 or -1: off), got {self.top_k!r}")
        if self.seed is not None and (
            not _is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_END - self.n
        ):
            raise ValueError(
                f"seed must be None or an int in [-2**63, 2**64 - n] (a torch generator "
                f"seed; sample i uses seed + i), got {self.seed!r}"
            )
        if self.stop_token_ids is None:
            raise ValueError("stop_token_ids must be a list of token ids (empty: none), not None")
        ids = tuple(as_token_id_list(self.stop_token_ids, "stop_token_ids"))
        object.__setattr__(self, "stop_token_ids", ids)
        _number_in(self.presence_penalty, -2, 2, "presence_penalty")
        _number_in(self.frequency_penalty, -2, 2, "frequency_penalty")
        rep = self.repetition_penalty
        if not isinstance(rep, int | float) or isinstance(rep, bool) or not 0 < rep < math.inf:
            raise ValueError(f"repetition_penalty must be a number > 0 (1: off), got {rep!r}")
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", _checked_bias(self.logit_bias) or None)
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise ValueError(
                f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {self.logprobs!r}"
            )

    @property
    def greedy(self) -> bool:
        """True when sampling is argmax (``temperature == 0``)."""
        return self.temperature == 0

    @property
    def processes_logits(self) -> bool:
        """True when a penalty, a bias or ``min_tokens`` may change the logits."""
        return bool(
            self.min_tokens
            or self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
        )

    def for_sample(self, index: int) -> SamplingParams:
        """The params of sample ``index`` of ``n``: ``n=1``, seed ``seed + index``."""
        if not 0 <= index < self.n:
            raise ValueError(f"sample index must be in [0, n={self.n}), got {index}")
        if self.n == 1:
            return self
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed)
