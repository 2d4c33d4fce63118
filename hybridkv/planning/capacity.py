"""Capacity figures: how many tokens and requests fit, hybrid vs naive.

- *Hybrid*: the plan's ``num_blocks`` (block 0 is the reserved null block)
  over the blocks one request of ``max_model_len`` tokens needs in every
  group (sliding and chunked groups keep only their window or chunk, a Mamba
  group its running state plus the step's checkpoints).
- *Naive*: what a non-hybrid engine does: every attention layer (sliding and
  chunked included) keeps full-attention KV for all tokens, in blocks of the
  requested block size; a Mamba layer keeps one unpadded state per request.

``max_concurrency`` is fractional, like vLLM's figure; ``kv_tokens`` is
``max_concurrency * max_model_len``, the context the cache holds when every
request is ``max_model_len`` long.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.specs import AttentionSpec, KVCacheSpec, MambaSpec
from hybridkv.specs.base import cdiv


@dataclass(frozen=True)
class Capacity:
    """Requests of ``max_model_len`` tokens that fit, and the tokens they hold."""

    bytes_per_request: int
    max_concurrency: float
    kv_tokens: int


def naive_bytes_per_request(
    raw_specs: dict[str, KVCacheSpec], max_model_len: int, block_size: int
) -> int:
    """Bytes one request needs if every attention layer kept full KV."""
    total = 0
    for spec in raw_specs.values():
        if isinstance(spec, AttentionSpec):
            per_token = spec.page_size_bytes // spec.block_size
            total += cdiv(max_model_len, block_size) * block_size * per_token
        elif isinstance(spec, MambaSpec):
            total += spec.state_size_bytes
        else:
            raise ValueError(f"unknown spec {spec!r}")
    return total


def capacity(available_bytes: int, bytes_per_request: int, max_model_len: int) -> Capacity:
    """Concurrency and tokens when each request takes ``bytes_per_request``."""
    conc = available_bytes / bytes_per_request
    return Capacity(bytes_per_request, conc, int(conc * max_model_len))
