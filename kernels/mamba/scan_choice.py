"""Which Mamba2 scan the ``triton`` backend runs for a batch: chunked or sequential.

``ssd_chunk_scan_fn`` (chunked SSD form) and ``ssd_scan_fn`` (one program walking each
sequence) share a contract, so the choice is speed alone. The chunked form runs a
batch of at least ``CHUNKED_MIN_TOKENS`` tokens that averages at least
``CHUNKED_MIN_PER_SEQ`` tokens per sequence; decode steps (one token per sequence)
and short steps stay sequential, where a chunk would be one token and its three
launches cost more than the walk. Measured on an H100 (third lease, 2026-11-26,
``benchmarks/results/kernels-nvidia-h100-80gb-hbm3.md``, bf16, the current tile
rules): the chunked form took 1.4-1.7x less time than the sequential one at 1 x 1,024
tokens, 2.3-3.4x less at 1 x 4,096 and 1.3-1.4x less at 8 x 512, for Bamba 9B and
Mamba2 2.7B heads. Batches mixing one long prefill with many decodes were not
measured, so they stay sequential. Both counts come from tensor shapes: no host sync.
"""

from __future__ import annotations

#: Fewest tokens in a batch for the chunked form (the smallest measured win: 8 x 512).
CHUNKED_MIN_TOKENS = 512
#: Fewest tokens per sequence on average for the chunked form.
CHUNKED_MIN_PER_SEQ = 64


def use_chunked(num_tokens: int, num_seqs: int) -> bool:
    """Whether the batch runs the chunked scan (see the module docstring)."""
    return num_tokens >= CHUNKED_MIN_TOKENS and num_tokens >= CHUNKED_MIN_PER_SEQ * num_seqs
