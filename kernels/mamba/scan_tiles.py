"""``ScanTiles``: the chunked Mamba2 scan's launch choices, for tuning runs.

``ssd_chunk_scan_fn(..., tiles=ScanTiles(...))`` overrides the Triton
launcher's rules (``ssd_chunk_scan_triton.py``) for one call, so that
``research/tune_mamba_scan.py`` can time the alternatives on a GPU without
editing the launcher; ``None`` fields keep the rule. Every choice computes the
same scan; only the speed changes, and with ``precision`` the rounding of the
matmul inputs (the tuning script checks each choice against the sequential
kernel). The torch backend has no tiles and ignores them, as ``TritonTiles``
is ignored by the attention op's torch backend.

The launcher's rules (``None``) were checked for registers and local memory on
sm_90 offline (``research/kernel_resources.py``) but not timed on a GPU; the sweep is
``research/tune_mamba_scan.py`` (the ``tune-mamba`` stage of
``tools/gpu/session.sh``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.kernels.tile_checks import power_of_two, stage_count

#: ``tl.dot``'s input precisions: fp32 operands multiplied as IEEE fp32 (CUDA cores),
#: as tf32 (tensor cores, 10-bit mantissa), as three tf32 products (about fp32
#: accuracy on tensor cores), or rounded to bf16 (tensor cores, 7-bit mantissa, what
#: mamba-ssm does for bf16 models). Every mode accumulates in fp32.
PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16")


@dataclass(frozen=True)
class ScanTiles:
    """Overrides of the chunked Mamba2 scan launcher's rules; ``None`` keeps a rule.

    - ``chunk_size``: tokens per chunk ``Q`` (16-256; the ``chunk_size=``
      argument says the same, and passing both raises);
    - ``block_p``: rows of ``head_dim`` per program (16-128);
    - ``block_n``: columns of ``d_state`` per program in the chunk-state and
      state-passing kernels and per loop step in the chunk-scan kernel
      (16-256); the rule takes all of ``d_state`` in one block;
    - ``block_m``: rows of the chunk per chunk-scan program (16-256; the rule: the
      chunk up to 64), so that chunks of 128-256 tokens hold no ``[Q, Q]`` tile;
    - ``block_k``: positions of the chunk per step of the chunk-state kernel and of
      the chunk-scan kernel's causal loop (16-256; the rule: the chunk up to 64);
      ``block_m`` and ``block_k`` above the chunk are cut to it;
    - ``pass_block``: elements of the flattened ``head_dim x d_state`` state per
      state-passing program (64-4,096; the rule: 512);
    - ``num_warps``, ``num_stages``: Triton's launch options (the chunk-state,
      C B^T and chunk-scan kernels; the state pass has its own 4 warps);
    - ``precision``: ``tl.dot``'s inputs, one of ``PRECISIONS``; the rule is
      ``"tf32x3"`` (``ssd_chunk_scan_triton.RULE_PRECISION``). Under Triton's
      interpreter ``"tf32"`` and ``"tf32x3"`` run as fp32 and ``"bf16"`` rounds
      the inputs to bf16 and multiplies in fp32
      (the interpreter cannot multiply bf16 tiles): the same products;
    - ``shared_cb``: ``True`` computes ``C B^T`` ([Q, Q] per chunk, over all of
      ``d_state``) once per (chunk, group) in a kernel of its own, into an fp32
      buffer that the chunk-scan kernel reads, instead of once per (chunk, head,
      block of ``head_dim``) inside it (as mamba-ssm's ``_bmm_chunk_fwd``); the
      rule (``None``) shares it above chunk 64 and computes it inside up to 64
      (``ssd_chunk_scan_triton.shares_cb``). Same products and sums.
    """

    chunk_size: int | None = None
    block_p: int | None = None
    block_n: int | None = None
    block_m: int | None = None
    block_k: int | None = None
    pass_block: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    precision: str | None = None
    shared_cb: bool | None = None

    def __post_init__(self) -> None:
        power_of_two("chunk_size", self.chunk_size, 16, 256)
        power_of_two("block_p", self.block_p, 16, 128)
        power_of_two("block_n", self.block_n, 16, 256)
        power_of_two("block_m", self.block_m, 16, 256)
        power_of_two("block_k", self.block_k, 16, 256)
        power_of_two("pass_block", self.pass_block, 64, 4096)
        power_of_two("num_warps", self.num_warps, 1, 16)
        stage_count(self.num_stages)
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(f"precision: must be one of {PRECISIONS}, got {self.precision!r}")
        if self.shared_cb is not None and not isinstance(self.shared_cb, bool):
            raise ValueError(f"shared_cb: must be True, False or None, got {self.shared_cb!r}")

    def describe(self) -> str:
        """``"chunk_size=128, shared_cb=True"``: the fields set (``"defaults"``)."""
        parts = [f"{k}={v}" for k, v in vars(self).items() if v is not None]
        return ", ".join(parts) or "defaults"


def check_tiles(tiles: object) -> ScanTiles:
    """``tiles`` itself, or ``ScanTiles()`` for None; raises ``TypeError`` for another type."""
    if tiles is None:
        return ScanTiles()
    if not isinstance(tiles, ScanTiles):
        raise TypeError(f"tiles: must be a ScanTiles, got {type(tiles).__name__}")
    return tiles
