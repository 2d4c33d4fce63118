"""``SamplingParams``: how one request samples and when it stops (vLLM names).

``temperature=0`` is greedy. ``top_k=0``/``-1`` and ``top_p=1`` disable those
filters. ``stop_token_ids`` end a request, as does the tokenizer's end of
sequence unless ``ignore_eos``. Invalid values raise ``ValueError`` naming the
field.

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

from dataclasses import dataclass, field

from hybridkv.token_ids import as_token_id_list

#: The seeds a ``torch.Generator`` takes: ``[-2**63, 2**64)``.
SEED_MIN, SEED_END = -(2**63), 2**64


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping settings of a request (see the module docstring)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens}")
        if not isinstance(self.temperature, int | float) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= -1 (0 or -1: off), got {self.top_k!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not SEED_MIN <= self.seed < SEED_END
        ):
            raise ValueError(
                f"seed must be None or an int in [-2**63, 2**64) (a torch generator seed), "
                f"got {self.seed!r}"
            )
        if self.stop_token_ids is None:
            raise ValueError("stop_token_ids must be a list of token ids (empty: none), not None")
        ids = tuple(as_token_id_list(self.stop_token_ids, "stop_token_ids"))
        object.__setattr__(self, "stop_token_ids", ids)

    @property
    def greedy(self) -> bool:
        """True when sampling is argmax (``temperature == 0``)."""
        return self.temperature == 0
