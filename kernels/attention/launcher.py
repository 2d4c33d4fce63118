"""Checked launcher of the Triton unified attention kernels.

Tile choices (constants with their reasons):

- ``BLOCK_M`` rows = ``BLOCK_Q`` query tokens x ``G`` query heads of one KV
  head. Decode-only batches use 16 (``tl.dot`` needs >= 16 rows; a decode has
  one token, so more rows would only idle); batches with prefill chunks use 64
  so that each K/V tile loaded serves more queries. Never fewer than ``G``.
- ``TILE_N`` keys per iteration: 64, or 32 for head sizes above 128 (the
  fp32 accumulator and the K/V tiles of head 256 would spill registers).
- Split-KV: only for decode-only batches on CUDA, when ``seqs x Hkv``
  programs would leave SMs idle; segments of at least 4 tiles, at most 16.
- ``num_warps`` 8 for tiles of at least 64 x 128 (rows x padded head), else
  4; Triton's default ``num_stages``.

``TritonTiles`` (``tiles.py``) overrides any of these for one call (tuning).
These rules are what the interpreter runs; they were never timed on a GPU
(``benchmarks/tune_attention.py`` is the sweep to run there).
"""

from __future__ import annotations

import torch
import triton

from hybridkv.kernels.attention.metadata import (
    AttentionInputs,
    AttentionMetadata,
    AttentionOptions,
)
from hybridkv.kernels.attention.tiles import TritonTiles
from hybridkv.kernels.attention.triton_kernel import (
    reduce_segments_kernel,
    unified_attention_kernel,
)

MAX_SEGMENTS = 16
MIN_TILES_PER_SEGMENT = 4
MAX_HEAD_SIZE = 256


def choose_blocks(
    meta: AttentionMetadata, num_queries_per_kv: int, block_m: int | None = None
) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_Q)`` for a batch (see the module docstring); ``block_m``
    overrides the rule (``TritonTiles``) and must hold one token's query heads."""
    least = max(16, triton.next_power_of_2(num_queries_per_kv))
    if block_m is None:
        block_m = max(16 if meta.is_decode_only else 64, least)
    elif block_m < least:
        raise ValueError(
            f"tiles.block_m={block_m}: a program's rows must hold the {num_queries_per_kv} "
            f"query heads of one KV head (at least {least})"
        )
    return block_m, block_m // num_queries_per_kv


def tile_n(head_size: int) -> int:
    return 32 if head_size > 128 else 64


def auto_segments(
    meta: AttentionMetadata,
    opts: AttentionOptions,
    num_kv_heads: int,
    device: torch.device,
    tile: int = 64,
    min_tiles: int = MIN_TILES_PER_SEGMENT,
) -> int:
    """How many split-KV segments a batch gets (1 = no split): ``tile`` keys per
    iteration, segments of at least ``min_tiles`` tiles."""
    if device.type != "cuda" or not meta.is_decode_only:
        return 1
    span = meta.max_seq_len
    for limit in (opts.sliding_window, opts.chunk_size):
        if limit is not None:
            span = min(span, limit)
    num_tiles = -(-span // tile)
    programs = meta.num_seqs * num_kv_heads
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-2 * sms // programs)
    return max(1, min(MAX_SEGMENTS, want, num_tiles // min_tiles))


def launch_unified_attention(
    a: AttentionInputs, num_segments: int | None = None, tiles: TritonTiles | None = None
) -> None:
    """Launch the kernel(s) for checked arguments; writes ``a.out``."""
    t = tiles or TritonTiles()
    q, key_cache, value_cache, out = a.q, a.key_cache, a.value_cache, a.out
    meta, opts, sinks = a.meta, a.opts, a.sinks
    num_tokens, num_heads, head_size = q.shape
    num_kv_heads = key_cache.shape[2]
    if head_size > MAX_HEAD_SIZE:
        raise ValueError(f"head size {head_size}: the Triton kernel supports up to 256")
    if num_tokens == 0:
        return
    g = num_heads // num_kv_heads
    block_m, block_q = choose_blocks(meta, g, t.block_m)
    head_pad = max(16, triton.next_power_of_2(head_size))
    keys = t.tile_n or tile_n(head_size)
    segments = num_segments or auto_segments(
        meta, opts, num_kv_heads, q.device, keys, t.min_tiles_per_segment or MIN_TILES_PER_SEGMENT
    )
    warps = t.num_warps or (8 if block_m * head_pad >= 64 * 128 else 4)
    stages = {} if t.num_stages is None else {"num_stages": t.num_stages}
    if segments > 1:
        part_max = torch.empty(
            num_tokens * num_heads * segments, dtype=torch.float32, device=q.device
        )
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty(part_max.numel() * head_pad, dtype=torch.float32, device=q.device)
    else:
        part_max = part_sum = part_acc = out  # unused
    sinks_f = sinks.float().contiguous() if sinks is not None else out
    grid = (num_tokens // block_q + meta.num_seqs, num_kv_heads, segments)
    unified_attention_kernel[grid](
        q,
        key_cache,
        value_cache,
        out,
        sinks_f,
        part_acc,
        part_max,
        part_sum,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_table,
        opts.scale,
        opts.softcap or 1.0,
        meta.num_seqs,
        key_cache.shape[1],
        head_size,
        opts.sliding_window or 0,
        opts.chunk_size or 0,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        meta.block_table.stride(0),
        G=g,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        TILE_N=keys,
        HEAD_PAD=head_pad,
        NUM_SEGMENTS=segments,
        USE_WINDOW=opts.sliding_window is not None,
        USE_CHUNK=opts.chunk_size is not None,
        USE_SOFTCAP=opts.softcap is not None,
        USE_SINKS=sinks is not None,
        IS_FP32=q.dtype == torch.float32,
        num_warps=warps,
        **stages,
    )
    if segments > 1:
        reduce_segments_kernel[(num_tokens, num_heads)](
            out,
            sinks_f,
            part_acc,
            part_max,
            part_sum,
            num_heads,
            head_size,
            out.stride(0),
            out.stride(1),
            NUM_SEGMENTS=segments,
            SEG_PAD=triton.next_power_of_2(segments),
            HEAD_PAD=head_pad,
            USE_SINKS=sinks is not None,
        )
