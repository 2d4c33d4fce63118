"""Triton kernels of unified paged attention (one launch for a mixed varlen batch).

Grid ``(q_blocks, Hkv, segments)``. A program takes ``BLOCK_Q`` query tokens of
one sequence times the ``G = Hq / Hkv`` query heads that share KV head
``kv_head`` (``BLOCK_M >= BLOCK_Q * G`` rows, so GQA heads reuse each K/V tile),
finds its sequence by binary search over ``query_start_loc`` (q blocks are
numbered ``query_start_loc[s] // BLOCK_Q + s + j``, which leaves at most one
idle program per sequence), and walks the keys in tiles of ``TILE_N``
positions gathered through the block table one position at a time (so any
block size works, including the non-powers of two that Mamba hybrids get).

Only tiles that intersect the visible range are visited: from the first key
the q block's first query can see (window start, chunk start, or 0) to its
last query (causal). Inside, the mask is exact per (query, key).

``SPLIT`` (split-KV) cuts that tile range into as many equal parts as the grid
has segments, each written as an unnormalised partial (acc, max, sum) that
``reduce_segments_kernel`` merges; sinks then enter in the merge. Without it the
kernel normalises and stores the output itself. Softmax runs in base 2 on fp32
logits. ``LONGEST_FIRST`` permutes the programs of the same grid so that the GPU's
dispatch order takes the q blocks last first, KV heads inner (``TritonTiles``).

Compiles: Triton compiles one binary per value of each ``tl.constexpr`` and, for
an integer argument, per "equal to 1" / "divisible by 16" / neither. The number
of segments is therefore read from the grid (``tl.num_programs(2)``) and passed
to the merge as a plain argument, and ``num_seqs`` and the block table's row
stride (both change from step to step) are not specialised
(``do_not_specialize``). Decode steps of batch 1 to 40 at 100 to 32,868 tokens
(every split of 1 to 16 segments) compile 4 attention binaries (short-span and
long-span tiles, each whole and split) and 4 merges (one per power of two of
segments), where the constexpr segment count and specialised batch size and table
width compiled 51 and 15: each a stall of the step that meets it first
(``research/kernel_resources.py --variants``; ``research/tests/test_kernel_resources.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):  # type: ignore[no-untyped-def]
    # The largest s with query_start_loc[s] // BLOCK_Q + s <= q_block.
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(query_start_loc_ptr + mid)
        if start // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def unified_attention_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    sinks_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_table_ptr,
    scale,
    softcap,
    num_seqs,
    block_size,
    head_size,
    window,
    chunk,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLIT: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_CHUNK: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_SINKS: tl.constexpr,
    IS_FP32: tl.constexpr,
    LONGEST_FIRST: tl.constexpr = False,
):
    if LONGEST_FIRST:
        # The GPU dispatches programs in the order of (axis 0 + axis 1 x its size): give
        # that order the q blocks last first, the KV heads inner (same grid, permuted).
        n_q = tl.num_programs(0)
        order = tl.program_id(0) + tl.program_id(1) * n_q
        q_block = n_q - 1 - order // tl.num_programs(1)
        kv_head = order % tl.num_programs(1)
    else:
        q_block = tl.program_id(0)
        kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    seq = _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local = q_block - (q_start // BLOCK_Q + seq)
    if local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    q_idx = local * BLOCK_Q + rows // G  # query token within the sequence
    head = kv_head * G + rows % G
    row_ok = (rows < BLOCK_Q * G) & (q_idx < q_len)
    q_pos = context + q_idx
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < head_size

    tok = (q_start + q_idx).to(tl.int64)
    q_offs = tok[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    # Visible key range of this q block: [lo, hi).
    first_pos = context + local * BLOCK_Q
    hi = context + tl.minimum((local + 1) * BLOCK_Q, q_len)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(first_pos - window + 1, 0)
    if USE_CHUNK:
        lo = (first_pos // chunk) * chunk
    tile_lo = lo // TILE_N
    tile_hi = tl.cdiv(hi, TILE_N)
    if SPLIT:
        per_segment = tl.cdiv(tile_hi - tile_lo, tl.num_programs(2))
        seg_lo = tile_lo + segment * per_segment
        seg_hi = tl.minimum(seg_lo + per_segment, tile_hi)
    else:
        seg_lo = tile_lo
        seg_hi = tile_hi

    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    if USE_SINKS and not SPLIT:
        m_i = tl.load(sinks_ptr + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)

    bt_row = block_table_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(seg_lo, seg_hi):
        k_pos = tile * TILE_N + tl.arange(0, TILE_N)
        k_ok = (k_pos >= lo) & (k_pos < hi)
        phys = tl.load(bt_row + k_pos // block_size, mask=k_ok, other=0).to(tl.int64)
        in_block = (k_pos % block_size).to(tl.int64)
        k_offs = (phys * stride_kb + in_block * stride_kt + kv_head * stride_kh)[None, :]
        kv_mask = dim_ok[:, None] & k_ok[None, :]
        k = tl.load(k_cache_ptr + k_offs + dims[:, None], mask=kv_mask, other=0.0)
        if IS_FP32:  # noqa: SIM108 (Triton resolves this constexpr branch at compile time)
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        if USE_SOFTCAP:
            x = s * scale / softcap
            s = softcap * (2.0 * tl.sigmoid(2.0 * x) - 1.0) * 1.4426950408889634
        else:
            s = s * qk_scale
        visible = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
        if USE_CHUNK:
            visible = visible & (k_pos[None, :] // chunk == q_pos[:, None] // chunk)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_offs = (phys * stride_vb + in_block * stride_vt + kv_head * stride_vh)[:, None]
        v = tl.load(
            v_cache_ptr + v_offs + dims[None, :], mask=k_ok[:, None] & dim_ok[None, :], other=0.0
        )
        if IS_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if not SPLIT:
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_offs = tok[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(
            out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :]
        )
    else:
        # Partials: [T, Hq, segments] for max/sum and [T, Hq, segments, HEAD_PAD].
        part = (tok * (G * tl.num_programs(1)) + head) * tl.num_programs(2) + segment
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * HEAD_PAD + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit(do_not_specialize=["num_segments"])
def reduce_segments_kernel(  # type: ignore[no-untyped-def]
    out_ptr,
    sinks_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    num_heads,
    head_size,
    stride_ot,
    stride_oh,
    num_segments,
    SEG_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    USE_SINKS: tl.constexpr,
):
    # One program per (token, query head): merges the split-KV partials.
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    segs = tl.arange(0, SEG_PAD)
    seg_ok = segs < num_segments
    base = (tok * num_heads + head) * num_segments
    m = tl.load(part_max_ptr + base + segs, mask=seg_ok, other=float("-inf"))
    l_seg = tl.load(part_sum_ptr + base + segs, mask=seg_ok, other=0.0)
    m_all = tl.max(m, axis=0)
    if USE_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        m_all = tl.maximum(m_all, sink)
    w = tl.exp2(m - m_all)
    total = tl.sum(l_seg * w, axis=0)
    if USE_SINKS:
        total += tl.exp2(sink - m_all)
    dims = tl.arange(0, HEAD_PAD)
    acc = tl.load(
        part_acc_ptr + (base + segs)[:, None] * HEAD_PAD + dims[None, :],
        mask=seg_ok[:, None],
        other=0.0,
    )
    o = tl.sum(acc * w[:, None], axis=0) / total
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + dims,
        o.to(out_ptr.dtype.element_ty),
        mask=dims < head_size,
    )
