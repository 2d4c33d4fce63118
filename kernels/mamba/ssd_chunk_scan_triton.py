"""Triton kernels and launcher of ``ssd_chunk_scan_fn`` (``ssd_chunk_scan.py``).

Imported only when the Triton backend runs the op (``triton`` is optional).

Speed (first and second H200 leases, Q 64, head_dim 64, d_state 128, the rules of
then: all matmuls IEEE fp32, all of d_state in one block, 8 warps): 0.5 TFLOP/s, 4-12x
slower than the sequential kernel. Per (chunk, head) the three matmuls of phase 3
and the one of phase 1 cost ~1.8M multiply-adds (19 GFLOP for 80 heads x 4k
tokens), and IEEE fp32 ``tl.dot`` runs them as FMA loops on CUDA cores; compiled for
sm_90 (``research/kernel_resources.py``, offline) the chunk-state and chunk-scan
kernels held 32 registers and 5-9 KB of local memory per thread. ``C B^T`` is also
recomputed per head though it depends only on the group (a quarter of the
multiply-adds; ``ScanTiles.shared_cb`` computes it once per (chunk, group) in
``_chunk_cb_kernel`` instead).

The rules now (``_choices``; 2026-11-26, after the second lease):
tf32x3 matmuls (about fp32's accuracy, on tensor cores) and d_state in blocks of
32 at 4 warps, which compile to wgmma with no local memory in all three kernels,
on Triton 3.6 and 3.9 (``research/tests/test_kernel_resources.py`` holds that). Every
choice is a ``ScanTiles`` field, swept by ``research/tune_mamba_scan.py``.

Chunks of 128 and 256 tokens (2026-11-28, ``research/mamba_scan_bytes.py``: at chunk
64 the fp32 per-chunk states move ~4x the bytes they move at mamba-ssm's 256): the
chunk scan covers a chunk in programs of ``BLOCK_M`` rows and walks its causal
columns ``BLOCK_K`` at a time, and the chunk-state kernel walks the chunk ``BLOCK_K``
positions a step, so no tile grows past ``[64, 64]`` whatever the chunk; phases 0-2
are in ``ssd_chunk_state_triton.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hybridkv.kernels.backend import interpreter_enabled
from hybridkv.kernels.mamba._common import chunk_layout
from hybridkv.kernels.mamba._triton_math import silu
from hybridkv.kernels.mamba.args import ScanArgs
from hybridkv.kernels.mamba.scan_tiles import ScanTiles
from hybridkv.kernels.mamba.ssd_chunk_scan import MIN_TILE as _MIN_TILE
from hybridkv.kernels.mamba.ssd_chunk_state_triton import (
    PER_CALL,
    _chunk_state_kernel,
    _state_passing_kernel,
    chunk_dt,
    dot,
)

# The rule's matmuls: three tf32 products (tf32x3), about fp32's accuracy on tensor
# cores. IEEE fp32 dots compiled for sm_90 to FMA loops on CUDA cores with 5-9 KB of
# local memory per thread (``research/kernel_resources.py``); tf32x3 to wgmma with
# none (with the d_state blocks below). Plain tf32 would cost ~1e-3 relative error in
# the states and bf16 more: ScanTiles.precision choices, for the GPU sweep to weigh.
# Under Triton's interpreter tf32x3 runs as fp32, as ieee does.
RULE_PRECISION = "tf32x3"
# The rule's d_state step: all of d_state in one [Q, d_state] tile made the chunk-scan
# kernel's tiles exceed the registers (d_state 128: 255 registers and local memory
# even with tensor cores at 8 warps); steps of 32 compile without local memory at 4
# warps for Q 64 (Bamba 9B and Mamba2 2.7B heads, ``research/kernel_resources.py``).
_RULE_BLOCK_N = 32
# The rule's rows per chunk-scan program and positions per step: the chunk up to 64
# (what chunk 64 ran as before blocking; larger chunks are split into 64s).
_RULE_BLOCK_MK = 64
# The rule's state-pass block: 512 fp32 elements at 4 warps is one 16-byte load per
# thread per chunk, and 16 programs per head of 64 x 128 (2,048 programs for Bamba
# 9B's 128 heads on one sequence: ~15 per SM of an H100's 132, where the blocks of
# 64 x 32 before gave 512). Swept as ScanTiles.pass_block.
_RULE_PASS_BLOCK = 512
_PASS_WARPS = 4
# What "bf16" runs as under the interpreter, whose tl.dot multiplies bf16 tiles'
# raw 16-bit patterns as integers: operands rounded to bf16, multiplied in fp32
# (a product of two bf16 values is exact in fp32, so only the summation order differs).
_BF16_ROUNDED = "bf16_rounded"
# Up to this many fp32 elements in a program's largest tile the rule keeps Triton's
# 4 warps; from a [64, 128] tile (the chunk-scan kernel holds several: C, B, the start
# state) 8 warps keep them in registers (64 per thread each instead of 128 with 4).
_FOUR_WARP_ELEMS = 4096


@triton.jit(do_not_specialize=PER_CALL)
def _chunk_cb_kernel(  # type: ignore[no-untyped-def]
    B_ptr, C_ptr, bounds_ptr, cb_ptr,
    num_chunks, d_state, stride_B_t, stride_B_g, stride_C_t, stride_C_g,
    stride_cb_c, stride_cb_g,
    Q: tl.constexpr, BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # Shared C B^T, one program per (chunk, group, [BLOCK, BLOCK] tile of the [Q, Q]
    # product): over all of d_state in steps of BLOCK_N, summed as the chunk-scan kernel
    # sums it; rows and columns past the chunk's end are 0 (their C and B rows load as 0).
    c = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    i = (tl.program_id(2) // (Q // BLOCK)) * BLOCK + tl.arange(0, BLOCK)
    j = (tl.program_id(2) % (Q // BLOCK)) * BLOCK + tl.arange(0, BLOCK)
    start = tl.load(bounds_ptr + c).to(tl.int64)
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    imask = start + i < end
    jmask = start + j < end
    C_rows = C_ptr + (start + i)[:, None] * stride_C_t + g * stride_C_g
    B_rows = B_ptr + (start + j)[:, None] * stride_B_t + g * stride_B_g
    cb = tl.zeros([BLOCK, BLOCK], tl.float32)
    for n0 in range(0, d_state, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < d_state
        C = tl.load(C_rows + n[None, :], mask=imask[:, None] & nmask[None, :], other=0.0)
        B = tl.load(B_rows + n[None, :], mask=jmask[:, None] & nmask[None, :], other=0.0)
        cb = dot(C.to(tl.float32), tl.trans(B.to(tl.float32)), cb, PRECISION)
    tl.store(cb_ptr + c * stride_cb_c + g * stride_cb_g + i[:, None] * Q + j[None, :], cb)


@triton.jit(do_not_specialize=PER_CALL)
def _chunk_scan_kernel(  # type: ignore[no-untyped-def]
    x_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bounds_ptr, dts_ptr, cums_ptr, states_ptr, state_ptr,
    save_ptr, out_ptr, cb_ptr,
    num_chunks, n_heads, head_dim, d_state, heads_per_group, p_blocks,
    stride_x_t, stride_x_h, stride_B_t, stride_B_g, stride_C_t, stride_C_g,
    stride_z_t, stride_z_h, stride_out_t, stride_out_h,
    stride_st_c, stride_st_h, stride_st_p, stride_s_slot, stride_s_h, stride_s_p,
    stride_cb_c, stride_cb_g,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, SHARED_CB: tl.constexpr,
):  # fmt: skip
    # Phase 3, one program per (chunk, head, block of head_dim x block of BLOCK_M rows of
    # the chunk); d_state in steps of BLOCK_N, the causal columns in steps of BLOCK_K.
    # SHARED_CB: C B^T read from _chunk_cb_kernel's [num_chunks, n_groups, Q, Q] buffer.
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = (tl.program_id(2) % p_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    m0 = (tl.program_id(2) // p_blocks) * BLOCK_M
    start = tl.load(bounds_ptr + c).to(tl.int64)
    end = tl.load(bounds_ptr + num_chunks + c).to(tl.int64)
    if start + m0 >= end:  # rows past the chunk (and empty chunks): nothing to write
        return
    i = m0 + tl.arange(0, BLOCK_M)
    pmask = p < head_dim
    tok = start + i
    tmask = tok < end
    row = (c * n_heads + h) * Q
    cum = tl.load(cums_ptr + row + i)  # [BLOCK_M]
    g = h // heads_per_group
    B_rows = B_ptr + g * stride_B_g
    C_rows = C_ptr + tok[:, None] * stride_C_t + g * stride_C_g
    st_rows = states_ptr + c * stride_st_c + h * stride_st_h + p[:, None] * stride_st_p
    # Inter-chunk: C h0^T over d_state (the start state read at each row), decayed.
    ch = tl.zeros([BLOCK_M, BLOCK_P], tl.float32)
    for n0 in range(0, d_state, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < d_state
        C = tl.load(C_rows + n[None, :], mask=tmask[:, None] & nmask[None, :], other=0.0)
        h0 = tl.load(st_rows + n[None, :], mask=pmask[:, None] & nmask[None, :], other=0.0)
        ch = dot(C.to(tl.float32), tl.trans(h0), ch, PRECISION)
    y = ch * tl.exp(cum)[:, None]
    # Intra-chunk: causal (C B^T) * exp(cum_i - cum_j) * dt_j, times x, over the columns
    # up to this block's last row.
    for k0 in range(0, tl.minimum(m0 + BLOCK_M, end - start), BLOCK_K):
        j = k0 + tl.arange(0, BLOCK_K)
        kmask = start + j < end
        if SHARED_CB:
            cb_offs = c * stride_cb_c + g * stride_cb_g + i[:, None] * Q + j[None, :]
            cb = tl.load(cb_ptr + cb_offs)
        else:
            cb = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
            for n0 in range(0, d_state, BLOCK_N):
                n = n0 + tl.arange(0, BLOCK_N)
                nmask = n < d_state
                C = tl.load(C_rows + n[None, :], mask=tmask[:, None] & nmask[None, :], other=0.0)
                B = tl.load(
                    B_rows + (start + j)[:, None] * stride_B_t + n[None, :],
                    mask=kmask[:, None] & nmask[None, :],
                    other=0.0,
                )
                cb = dot(C.to(tl.float32), tl.trans(B.to(tl.float32)), cb, PRECISION)
        causal = i[:, None] >= j[None, :]
        diff = tl.where(causal, cum[:, None] - tl.load(cums_ptr + row + j)[None, :], float("-inf"))
        xk_ptrs = x_ptr + (start + j)[:, None] * stride_x_t + h * stride_x_h + p[None, :]
        xk = tl.load(xk_ptrs, mask=kmask[:, None] & pmask[None, :], other=0.0)
        w = cb * tl.exp(diff) * tl.load(dts_ptr + row + j)[None, :]
        y = dot(w, xk.to(tl.float32), y, PRECISION)
    qp = tmask[:, None] & pmask[None, :]
    if HAS_D:
        x = tl.load(x_ptr + tok[:, None] * stride_x_t + h * stride_x_h + p[None, :], mask=qp)
        y += tl.load(D_ptr + h).to(tl.float32) * x.to(tl.float32)
    if HAS_Z:
        z_ptrs = z_ptr + tok[:, None] * stride_z_t + h * stride_z_h + p[None, :]
        y *= silu(tl.load(z_ptrs, mask=qp, other=0.0).to(tl.float32))
    o_ptrs = out_ptr + tok[:, None] * stride_out_t + h * stride_out_h + p[None, :]
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=qp)
    # Saves on this block's rows but the chunk's last (phase 2's): the k-th one is found
    # by rank, so the loop runs once per save, not once per row.
    slots = tl.load(save_ptr + tok, mask=tok < end - 1, other=-1).to(tl.int64)
    saving = (slots >= 0).to(tl.int32)
    rank = tl.cumsum(saving, axis=0) - 1
    for k in range(tl.sum(saving, axis=0)):
        pick = (saving > 0) & (rank == k)
        _save_at(
            x_ptr, B_rows, dts_ptr, cums_ptr, st_rows, state_ptr, row, start, h, p,
            tl.sum(tl.where(pick, i, 0), axis=0), tl.sum(tl.where(pick, slots, 0), axis=0),
            tl.sum(tl.where(pick, cum, 0.0), axis=0), head_dim, d_state,
            stride_x_t, stride_x_h, stride_B_t, stride_s_slot, stride_s_h, stride_s_p,
            BLOCK_K, BLOCK_N, PRECISION,
        )  # fmt: skip


@triton.jit
def _save_at(  # type: ignore[no-untyped-def]
    x_ptr, B_rows, dts_ptr, cums_ptr, st_rows, state_ptr, row, start, h, p, at, slot, cum_at,
    head_dim, d_state, stride_x_t, stride_x_h, stride_B_t, stride_s_slot, stride_s_h,
    stride_s_p, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Save into ``slot`` the state after the chunk's row ``at``:
    exp(cum_at) h0 + sum_{j<=at} exp(cum_at - cum_j) dt_j x_j B_j^T, per block of d_state."""
    pmask = p < head_dim
    s_rows = state_ptr + slot * stride_s_slot + h * stride_s_h + p[:, None] * stride_s_p
    for n0 in range(0, d_state, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        pn = pmask[:, None] & (n[None, :] < d_state)
        st = tl.exp(cum_at) * tl.load(st_rows + n[None, :], mask=pn, other=0.0)
        for k0 in range(0, at + 1, BLOCK_K):
            j = k0 + tl.arange(0, BLOCK_K)
            upto = j <= at  # rows up to `at` are inside the chunk
            d = tl.where(upto, cum_at - tl.load(cums_ptr + row + j), 0.0)
            w = tl.where(upto, tl.exp(d) * tl.load(dts_ptr + row + j), 0.0)
            xT = tl.load(  # [BLOCK_P, BLOCK_K]
                x_ptr + (start + j)[None, :] * stride_x_t + h * stride_x_h + p[:, None],
                mask=upto[None, :] & pmask[:, None],
                other=0.0,
            ).to(tl.float32)
            B = tl.load(
                B_rows + (start + j)[:, None] * stride_B_t + n[None, :],
                mask=upto[:, None] & (n[None, :] < d_state),
                other=0.0,
            ).to(tl.float32)
            st = dot(xT * w[None, :], B, st, PRECISION)
        tl.store(s_rows + n[None, :], st.to(state_ptr.dtype.element_ty), mask=pn)


@dataclass(frozen=True, slots=True)
class _Choice:
    """One call's launch choices (``ScanTiles`` where set, else the rules)."""

    block_p: int
    block_n: int
    block_m: int
    block_k: int
    pass_block: int
    precision: str
    opts: dict


def _choices(tiles: ScanTiles, q: int, head_dim: int, d_state: int) -> _Choice:
    """The launch choices: ``tiles`` where set, else the rules.

    Rules (checked for registers and local memory on sm_90 offline;
    ``research/tune_mamba_scan.py`` sweeps them): up to 64 rows of ``head_dim`` per
    program, ``d_state`` in blocks of up to ``_RULE_BLOCK_N``, the chunk in rows and
    steps of up to ``_RULE_BLOCK_MK`` (all at least ``tl.dot``'s 16), tf32x3
    matmuls (``RULE_PRECISION``), 8 warps where a tile exceeds ``[64, 64]`` fp32
    (``_FOUR_WARP_ELEMS``), else Triton's 4; the state pass in blocks of
    ``_RULE_PASS_BLOCK`` at ``_PASS_WARPS``. A ``block_m`` or ``block_k`` above the
    chunk is cut to the chunk.
    """
    block_n = tiles.block_n or max(_MIN_TILE, min(_RULE_BLOCK_N, triton.next_power_of_2(d_state)))
    block_p = tiles.block_p or max(_MIN_TILE, min(64, triton.next_power_of_2(head_dim)))
    block_m = min(q, tiles.block_m or _RULE_BLOCK_MK)
    block_k = min(q, tiles.block_k or _RULE_BLOCK_MK)
    largest = max(block_m * block_k, max(block_m, block_k, block_p) * block_n)
    opts = {"num_warps": tiles.num_warps or (8 if largest > _FOUR_WARP_ELEMS else 4)}
    if tiles.num_stages is not None:
        opts["num_stages"] = tiles.num_stages
    precision = tiles.precision or RULE_PRECISION
    if precision == "bf16" and interpreter_enabled():
        precision = _BF16_ROUNDED
    pass_block = tiles.pass_block or _RULE_PASS_BLOCK
    return _Choice(block_p, block_n, block_m, block_k, pass_block, precision, opts)


def shares_cb(tiles: ScanTiles, q: int) -> bool:
    """Whether C B^T is computed once per (chunk, group) (``_shared_cb``): ``tiles.shared_cb``
    where set, else above chunk 64, where per head it would be ~40 % of the multiply-adds
    at chunk 256 (Bamba 9B heads, ``research/mamba_scan_bytes.py``) and the shared buffer
    a few MB."""
    return tiles.shared_cb if tiles.shared_cb is not None else q > _RULE_BLOCK_MK


def _shared_cb(
    B: torch.Tensor, C: torch.Tensor, bounds: torch.Tensor, q: int, block_n: int,
    precision: str, opts: dict,
) -> torch.Tensor:  # fmt: skip
    """``C B^T`` per (chunk, group): fp32 ``[num_chunks, n_groups, Q, Q]``, 0 past a
    chunk's end, summed over ``d_state`` in blocks of ``block_n`` as in the chunk scan,
    in tiles of up to ``[64, 64]``."""
    num_chunks, (n_groups, d_state) = bounds.shape[1], B.shape[1:]
    cb = torch.empty((num_chunks, n_groups, q, q), dtype=torch.float32, device=B.device)
    block = min(q, _RULE_BLOCK_MK)  # tiles of at most [64, 64]: [256, 256] spilled on sm_90
    _chunk_cb_kernel[(num_chunks, n_groups, (q // block) ** 2)](
        B, C, bounds, cb, num_chunks, d_state,
        B.stride(0), B.stride(1), C.stride(0), C.stride(1), cb.stride(0), cb.stride(1),
        Q=q, BLOCK=block, BLOCK_N=block_n, PRECISION=precision, **opts,
    )  # fmt: skip
    return cb


def launch(a: ScanArgs, q: int, tiles: ScanTiles) -> torch.Tensor:
    x, B, C, z, ssm_state, qsl = a.x, a.B, a.C, a.z, a.ssm_state, a.query_start_loc
    num_tokens, n_heads, head_dim = x.shape
    n_groups, d_state = B.shape[1], B.shape[2]
    out = torch.empty((num_tokens, n_heads, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    bounds, first = chunk_layout(qsl, num_tokens, q)
    num_chunks = bounds.shape[1]
    states = torch.empty(
        (num_chunks, n_heads, head_dim, d_state), dtype=torch.float32, device=x.device
    )
    dts, cums, dA_sum, end_save = chunk_dt(a, bounds, q)
    ch = _choices(tiles, q, head_dim, d_state)
    p_blocks = triton.cdiv(head_dim, ch.block_p)
    n_blocks = triton.cdiv(d_state, ch.block_n)
    D, z_, _ = a.optional_ptrs(a.A)
    flags = a.kernel_flags()
    hpg = n_heads // n_groups
    sts = (states.stride(0), states.stride(1), states.stride(2))
    sss = (ssm_state.stride(0), ssm_state.stride(1), ssm_state.stride(2))
    _chunk_state_kernel[(num_chunks, n_heads, p_blocks * n_blocks)](
        x, B, bounds, dts, cums, dA_sum, states,
        num_chunks, n_heads, head_dim, d_state, hpg, n_blocks,
        x.stride(0), x.stride(1), B.stride(0), B.stride(1), *sts,
        Q=q, BLOCK_P=ch.block_p, BLOCK_N=ch.block_n, BLOCK_K=ch.block_k,
        PRECISION=ch.precision, **ch.opts,
    )  # fmt: skip
    pass_blocks = triton.cdiv(head_dim * d_state, ch.pass_block)
    _state_passing_kernel[(qsl.shape[0] - 1, n_heads, pass_blocks)](
        states, dA_sum, end_save, first, ssm_state, a.initial_state_indices,
        n_heads, head_dim, d_state, states.stride(0), states.stride(1), *sss,
        PASS_BLOCK=ch.pass_block, num_warps=_PASS_WARPS,
    )  # fmt: skip
    shared = shares_cb(tiles, q)
    cb = _shared_cb(B, C, bounds, q, ch.block_n, ch.precision, ch.opts) if shared else dts
    cbs = (cb.stride(0), cb.stride(1)) if shared else (0, 0)
    zs = (z.stride(0), z.stride(1)) if z is not None else (0, 0)
    m_blocks = triton.cdiv(q, ch.block_m)
    _chunk_scan_kernel[(num_chunks, n_heads, p_blocks * m_blocks)](
        x, B, C, D, z_, bounds, dts, cums, states, ssm_state, a.save_state_indices, out, cb,
        num_chunks, n_heads, head_dim, d_state, hpg, p_blocks,
        x.stride(0), x.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zs[0], zs[1], out.stride(0), out.stride(1), *sts, *sss, *cbs,
        HAS_D=flags["HAS_D"], HAS_Z=flags["HAS_Z"], Q=q, BLOCK_M=ch.block_m,
        BLOCK_K=ch.block_k, BLOCK_P=ch.block_p, BLOCK_N=ch.block_n, PRECISION=ch.precision,
        SHARED_CB=shared, **ch.opts,
    )  # fmt: skip
    return out
