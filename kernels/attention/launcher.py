"""Checked launcher of the Triton unified attention kernels.

The launch choices (rows per program, keys per iteration, warps, stages,
split-KV) are the rules of ``launch_rules.py``, which says which were measured
on an H200 and which are untested; ``TritonTiles`` (``tiles.py``) overrides
them for one call.

What a call costs on the host, and what is paid once per step: the choices,
the grids and the split-KV partials buffer depend only on the step's metadata
and the layer's geometry, so the first layer computes them into
``meta.derived`` (``AttentionPlans``) and the other layers of the group look
them up (one dict lookup). Per call there remain the kernel launch(es) (two
with a split: attention, then the merge of the partials) and, in
``unified_attention``, the output's allocation when no ``out`` is given. No
call reads device memory back, queries the device, or allocates the partials
again; sinks are passed in their own dtype (the kernels cast them).
``tests/kernels/test_attention_hot_path.py`` counts this.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from hybridkv.kernels.attention.launch_rules import (
    MAX_HEAD_SIZE,
    BatchKind,
    LaunchChoice,
    choose_launch,
    head_pad,
    next_power_of_2,
)
from hybridkv.kernels.attention.metadata import (
    AttentionInputs,
    AttentionMetadata,
    AttentionOptions,
    AttentionPlans,
)
from hybridkv.kernels.attention.tiles import TritonTiles
from hybridkv.kernels.attention.triton_kernel import (
    reduce_segments_kernel,
    unified_attention_kernel,
)


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """One layer geometry's launches for one step: the choices and the grids."""

    choice: LaunchChoice
    head_pad: int
    grid: tuple[int, int, int]
    #: ``(tokens, query heads)``: the merge of the partials, when ``segments > 1``.
    reduce_grid: tuple[int, int]
    #: Partial rows ``tokens x query heads x segments`` (0 without a split).
    partial_rows: int

    def partial_views(
        self, derived: AttentionPlans, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(acc [rows * HEAD_PAD], max [rows], sum [rows])`` in the step's workspace.

        Each starts 16-byte aligned (the alignment Triton specializes pointers on).
        """
        rows, acc = self.partial_rows, self.partial_rows * self.head_pad
        aligned = -(-rows // 4) * 4
        buf = derived.partials(acc + 2 * aligned, device)
        return buf[:acc], buf[acc : acc + rows], buf[acc + aligned : acc + aligned + rows]


def visible_span(meta: AttentionMetadata, opts: AttentionOptions) -> int:
    """The most keys one query can see: the longest sequence, cut to the window/chunk."""
    span = meta.max_seq_len
    for limit in (opts.sliding_window, opts.chunk_size):
        if limit is not None:
            span = min(span, limit)
    return span


def within_reach(meta: AttentionMetadata, opts: AttentionOptions) -> AttentionOptions:
    """``opts`` without a sliding window or chunk that no sequence of ``meta`` outgrows.

    A window ``W >= max_seq_len`` hides no key from any query (``q - W < 0 <= k``), and a
    chunk ``C >= max_seq_len`` holds every position (``k // C == q // C == 0``): such a
    layer attends to exactly the keys full attention does, and the kernel's full path
    skips the per-tile window and chunk bounds (Llama 4's chunks of 8,192 and Gemma 3's
    windows over shorter prompts; on an H100 a chunked 1 x 2k prefill took 1.70x flash
    SDPA against full attention's 1.54x). Under a CUDA graph the metadata's lengths are
    its span class, at least any replayed step's (``hybridkv.engine.graphs``).
    """
    n = meta.max_seq_len
    window, chunk = opts.sliding_window, opts.chunk_size
    if (window is not None and window >= n) or (chunk is not None and chunk >= n):
        return replace(opts, sliding_window=None, chunk_size=None)
    return opts


@functools.cache
def device_sms(device: torch.device) -> int:
    """``device``'s streaming multiprocessors; 0 off CUDA (no automatic split-KV)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def plan_launch(
    meta: AttentionMetadata,
    opts: AttentionOptions,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device,
    tiles: TritonTiles | None = None,
    num_segments: int | None = None,
    sms: int | None = None,
) -> LaunchPlan:
    """The launches of one layer geometry on ``meta``'s batch (pure but for reading
    ``device``'s SM count once when ``sms`` is None; cached by the caller)."""
    if head_size > MAX_HEAD_SIZE:
        raise ValueError(f"head size {head_size}: the Triton kernel supports up to 256")
    g = num_heads // num_kv_heads
    kind = BatchKind.of(meta.max_query_len, meta.min_query_len)
    choice = choose_launch(
        kind,
        visible_span(meta, opts),
        g,
        head_size,
        dtype.itemsize,
        device_sms(device) if sms is None else sms,
        meta.num_seqs * num_kv_heads,
        tiles,
        num_segments,
    )
    tokens = meta.num_tokens
    return LaunchPlan(
        choice=choice,
        head_pad=head_pad(head_size),
        grid=(tokens // choice.block_q + meta.num_seqs, num_kv_heads, choice.segments),
        reduce_grid=(tokens, num_heads),
        partial_rows=tokens * num_heads * choice.segments if choice.segments > 1 else 0,
    )


def launch_unified_attention(
    a: AttentionInputs, num_segments: int | None = None, tiles: TritonTiles | None = None
) -> None:
    """Launch the kernel(s) for checked arguments; writes ``a.out``."""
    q, key_cache, value_cache, out = a.q, a.key_cache, a.value_cache, a.out
    meta, opts, sinks = a.meta, a.opts, a.sinks
    num_tokens, num_heads, head_size = q.shape
    num_kv_heads = key_cache.shape[2]
    device = q.device
    key = (
        num_heads,
        num_kv_heads,
        head_size,
        q.dtype,
        device,
        opts.sliding_window,
        opts.chunk_size,
        tiles,
        num_segments,
    )
    cached = meta.derived.launches.get(key)
    if cached is None:
        reach = within_reach(meta, opts)
        plan = plan_launch(
            meta, reach, num_heads, num_kv_heads, head_size, q.dtype, device, tiles, num_segments
        )
        parts = plan.partial_views(meta.derived, device) if plan.partial_rows else None
        cached = meta.derived.launches[key] = (plan, parts, reach)
    plan, parts, opts = cached
    if num_tokens == 0:
        return
    c = plan.choice
    segments = c.segments
    part_acc, part_max, part_sum = parts if parts is not None else (out, out, out)  # unused
    if sinks is not None and sinks.stride(0) != 1:
        sinks = sinks.contiguous()
    sinks_arg = sinks if sinks is not None else out
    qs, os_ = q.stride(), out.stride()
    ks, vs = key_cache.stride(), value_cache.stride()
    unified_attention_kernel[plan.grid](
        q,
        key_cache,
        value_cache,
        out,
        sinks_arg,
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
        qs[0],
        qs[1],
        os_[0],
        os_[1],
        ks[0],
        ks[1],
        ks[2],
        vs[0],
        vs[1],
        vs[2],
        meta.block_table.stride(0),
        G=num_heads // num_kv_heads,
        BLOCK_Q=c.block_q,
        BLOCK_M=c.block_m,
        TILE_N=c.tile_n,
        HEAD_PAD=plan.head_pad,
        SPLIT=segments > 1,
        USE_WINDOW=opts.sliding_window is not None,
        USE_CHUNK=opts.chunk_size is not None,
        USE_SOFTCAP=opts.softcap is not None,
        USE_SINKS=sinks is not None,
        IS_FP32=q.dtype == torch.float32,
        LONGEST_FIRST=c.longest_first,
        num_warps=c.num_warps,
        num_stages=c.num_stages,
    )
    if segments > 1:
        reduce_segments_kernel[plan.reduce_grid](
            out,
            sinks_arg,
            part_acc,
            part_max,
            part_sum,
            num_heads,
            head_size,
            os_[0],
            os_[1],
            segments,
            SEG_PAD=next_power_of_2(segments),
            HEAD_PAD=plan.head_pad,
            USE_SINKS=sinks is not None,
        )
